"""The FUSE daemon: the FUSE operations (fusefs), the view server and its caches (server),
the binding (fuse_binding), the daemon's status file (daemon_status), its privileges once
mounted (privileges), its memory settings (lowmem), and the mountpoint helpers
(mountpoint: find, probe and wait for a guestfs mount) that the commands share.

Every cache the daemon keeps (what it holds, its bound, its freshness) is mapped in
docs/mount.md, "Map of the caches"."""
