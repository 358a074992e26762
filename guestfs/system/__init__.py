"""Operating-system helpers every stage may use: libc calls Python lacks (mount(2),
unshare(2), capabilities), files written safely as root, one-line and rate-limited
messages, and starting our own code in a new process or a fork."""
