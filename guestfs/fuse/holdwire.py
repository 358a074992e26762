"""The messages between a FUSE holder (``holder``) and the daemons that serve its
connection, over AF_UNIX SOCK_SEQPACKET: one message per packet, a verb, a newline and
an opaque payload, at most ``MAX_MESSAGE`` bytes and ``MAX_FDS`` descriptors.

Standard library only, and no json: the holder imports this and must stay small.

Verbs, daemon to holder: ``negotiated`` (the INIT parameters, as
``session.Negotiated.to_json``: sent once the daemon serves), ``serve`` (a daemon asks
for the connection; its payload is the asker's pid), ``stop`` (a clean stop: detach the
mount and exit). Holder to daemon: ``ready`` (once it listens), ``granted`` (the
/dev/fuse descriptor and the mount lock; payload: the negotiated parameters), ``refused``
(payload: why, one line), ``yield`` (a daemon the holder started itself is asked to make
way for one that asked). To the standalone holder (`guestfs fuse-holder`, listening on
``HANDOFF``): ``hold`` (a mount just made: the /dev/fuse descriptor and the mount lock;
payload ``SOCKET-NAME\nMOUNTPOINT``). A daemon's stop is never said to it: its lease
ends with its process, and the connection is kept for the next daemon.

The PSI triggers readers keep on the connection's open files outlive their daemon the
same way (daemon/psi_triggers.py): ``keep`` (daemon to holder; payload ``FH\nRECORD``,
the trigger file's descriptor the first time, the record alone after) has the holder
keep a trigger, ``drop`` (payload ``FH``) let it go, and ``kept`` (holder to a
successor, before its ``granted``; as ``keep``, with the descriptor) hands each on. The
record is the daemon's, opaque to the holder.
"""

from __future__ import annotations

import _socket as socket  # not socket.py: the holder imports this (holder.py says why)
import os
import sys

MAX_MESSAGE = 65536
MAX_FDS = 2
SUFFIX = ".holder"     # <lock dir>/<mount key>.holder: the holder's listening socket
HANDOFF = "fuse-holder.sock"   # <lock dir>/fuse-holder.sock: the standalone holder's
# /proc/PID/comm of a holder: what ps, pgrep -x and top show. Here, not in holder.py, so
# that the serving daemon names its holder's child without importing the holder (52 KiB).
HOLDER_NAME = b"guestfs-holder"
VERBS = frozenset({b"ready", b"negotiated", b"serve", b"stop", b"granted", b"refused",
                   b"yield", b"hold", b"keep", b"drop", b"kept"})


class BadMessage(ValueError):
    pass


def send(sock: socket.socket, verb: bytes, payload: bytes = b"",
         fds: tuple[int, ...] = (), flags: int = 0) -> None:
    """``flags``: MSG_DONTWAIT where a full socket must not block the sender (a serving
    daemon's worker must never wait for its holder)."""
    data = verb + b"\n" + payload
    if verb not in VERBS or len(data) > MAX_MESSAGE or len(fds) > MAX_FDS:
        raise BadMessage(f"cannot send {verb!r} ({len(data)} bytes, {len(fds)} fds)")
    if fds:
        sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, _pack_fds(fds))],
                     flags)
    else:
        sock.send(data, flags)


def recv(sock: socket.socket) -> tuple[bytes, bytes, list[int]] | None:
    """(verb, payload, descriptors), or None at end of file. Descriptors arrive
    close-on-exec; a message that is not one of ours is refused (BadMessage) with every
    descriptor it carried closed."""
    # Not socket.recv_fds: it drops its flags argument (CPython 3.11), and a descriptor
    # must never reach a program this process starts.
    data, ancdata, flags, _ = sock.recvmsg(MAX_MESSAGE + 1,
                                           socket.CMSG_SPACE(MAX_FDS * 4),
                                           socket.MSG_CMSG_CLOEXEC)
    fds = [fd for level, kind, raw in ancdata
           if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
           for fd in _unpack_fds(raw)]
    if not data and not fds:
        return None
    verb, sep, payload = data.partition(b"\n")
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or not sep or verb not in VERBS \
            or len(data) > MAX_MESSAGE:
        for fd in fds:
            os.close(fd)
        raise BadMessage(f"not a holder message ({len(data)} bytes, flags {flags:#x})")
    return verb, payload, fds


def trigger_payload(fh: int, record: bytes) -> bytes:
    """The payload of ``keep`` and ``kept``: ``FH\nRECORD``."""
    return b"%d\n%s" % (fh, record)


def split_trigger(payload: bytes, fds: list[int]) -> tuple[int, bytes, int | None] | None:
    """(handle, record, descriptor or None) of a ``keep`` or ``kept``; None, with its
    descriptor closed, for a payload without a handle. Descriptors past the first are
    closed."""
    head, _, record = payload.partition(b"\n")
    for extra in fds[1:]:
        os.close(extra)
    fd = fds[0] if fds else None
    try:
        fh = int(head)
    except ValueError:
        fh = -1
    if fh < 0:
        if fd is not None:
            os.close(fd)
        return None
    return fh, record, fd


# SCM_RIGHTS carries C ints. Not the array module: it loads collections.abc, 0.3 MiB of
# the holder's memory.
_INT = 4


def _pack_fds(fds: tuple[int, ...]) -> bytes:
    return b"".join(fd.to_bytes(_INT, sys.byteorder, signed=True) for fd in fds)


def _unpack_fds(raw: bytes) -> list[int]:
    return [int.from_bytes(raw[i:i + _INT], sys.byteorder, signed=True)
            for i in range(0, len(raw) - len(raw) % _INT, _INT)]


def peer_ids(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end (SO_PEERCRED)."""
    import struct
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", raw)
    return pid, uid
