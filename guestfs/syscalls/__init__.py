"""What no file can answer: sysinfo(2) and the affinity CPU count through seccomp user
notification. The filter (filter.py), the notification loop and the caller's memory
(notify.py), the answers from the served files (answers.py), the guard that outlives a
supervisor (guard.py), the agent's side of its keeper (keeper.py), and the successor a
guard starts when `guestfs run` is gone (successor.py)."""
