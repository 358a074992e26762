"""Host sources: everything read from the host (/proc, /sys, cgroupfs, mountinfo), as
plain parsers and reads under a HostRoot. Nothing here knows about limits policy."""
