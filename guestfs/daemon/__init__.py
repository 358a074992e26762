"""The FUSE daemon: the FUSE operations, the view server and its caches, the binding, the
daemon's status file and its privileges."""
