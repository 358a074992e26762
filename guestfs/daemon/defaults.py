"""The daemon's views and defaults as the command line offers them: names only, so that
parsing a command (`guestfs run` above all, whose start-up the app waits for) loads none
of the serving code."""

VIEWS = ("caller", "init", "self")
DEFAULT_VIEW = "caller"
DEFAULT_CACHE_TTL = 0.5
BINDINGS = ("auto", "mfusepy3", "mfusepy2", "fusepy", "guestfs")  # --fuse-binding (fuse_binding.py)
