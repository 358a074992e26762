"""Putting the served files and answers into containers guestfs did not start: `guestfs
attach` (attach.py), the OCI hook (ocihook.py), runc's seccomp agent (seccomp_agent.py),
and entering another process's namespaces safely (enter.py)."""
