"""Keeping the daemon's resident memory small: it lives in the container's cgroup, and in
the ``guestfs run`` wrapper pattern every MiB it holds counts against the application's
memory limit (docs/performance.md, "Daemon memory")."""

from __future__ import annotations

from guestfs.system import libc

M_ARENA_MAX = -8  # glibc's mallopt parameter


def one_malloc_arena() -> bool:
    """Have glibc's malloc serve every thread from one arena. By default each libfuse worker
    thread that allocates (a rendering of more than 512 bytes, a dict's table) gets an arena
    of its own, and the memory freed in it stays there: about 1 MiB more RSS after a few
    thousand reads (benchmarks/bench_rss_imports.py). The GIL serialises the Python work
    those threads do anyway. Call before any thread starts; False where there is no glibc
    mallopt (musl has one that does nothing)."""
    if libc.mallopt is None:
        return False
    return bool(libc.mallopt(M_ARENA_MAX, 1))
