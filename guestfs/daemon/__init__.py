"""The FUSE daemon (`guestfs mount`): its start-up and loop (mount), one daemon per
mountpoint (mountlock), the served-file table that reads each file's usage and renders it
(file_table), the FUSE operations (fusefs), the view server and its caches (server,
readers, renderings, kernel_entries), the binding (fuse_binding) and the choices the
command line offers before any of it is loaded (defaults), the daemon's status file
(daemon_status), its privileges once mounted (privileges), its memory settings (lowmem),
and the mountpoint helpers (mountpoint: find, probe and wait for a guestfs mount) that
run and attach share.

Every cache the daemon keeps (what it holds, its bound, its freshness) is mapped in
docs/mount.md, "Map of the caches"."""
