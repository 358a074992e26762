"""Operating-system helpers every stage may use: libc calls Python lacks (mount(2),
capabilities), files written safely as root, one-line errors, starting our own code, and
probing a mountpoint."""
