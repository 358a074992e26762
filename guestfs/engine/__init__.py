"""The limits engine: pure functions from what the sources read to the effective limits,
each with the file and cgroup level that set it. No file is read here."""
