"""guestfs: cgroup-aware /proc and /sys files served from inside a container."""

__version__ = "0.1.0"
