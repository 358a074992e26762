"""guestfs's own FUSE protocol engine: the kernel's /dev/fuse protocol spoken directly,
without libfuse, so that a connection can be served by a process that did not open or
initialise it (the takeover of a mount by a successor daemon), and so that protocol
features libfuse 3.14 cannot reach (FUSE_ALLOW_IDMAP, FUSE_NOTIFY_RESEND,
FUSE_NOTIFY_INVAL_INODE) are available.

One job per module: ``abi`` (the kernel ABI of include/uapi/linux/fuse.h), ``decode``
(untrusted request frames to requests or a clean errno), ``inodes`` (the bounded
nodeid <-> path table), ``session`` (INIT and the serving loop), ``mountfd`` (/dev/fuse
mounted by mount(2) or fusermount3), ``adapter`` (guestfs's mfusepy-style operations
served through the engine: the ``--fuse-binding guestfs`` module), ``holder`` (the
process that keeps a connection open across its daemons' deaths: `mount --hold`) and
``holdwire`` (the messages between it and the daemons). Standard library only; nothing
here imports the daemon or the commands.
"""
