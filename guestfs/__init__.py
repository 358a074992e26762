"""guestfs: cgroup-aware /proc and /sys files served from inside a container."""

__version__ = "0.1.0"

# guestfs run's mount, and attach's default source. Here rather than in wrap/run.py so that the
# command line (and the daemon, which parses one) need not import it.
DEFAULT_MOUNTPOINT = "/run/guestfs"
# The DaemonSet's per-container mount: where the OCI hook finds each container's files.
DEFAULT_HOOK_SOURCE = "/var/lib/guestfs/by-container"
