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


def release_free_heap() -> bool:
    """Hand the pages malloc holds free back to the kernel (glibc's ``malloc_trim(0)``):
    what a per-container daemon calls once it has forgotten vanished containers. Their
    renderings, views and inode-table entries are freed then, but glibc keeps the heap
    they were made in, and it trims only a free top: everything freed below a live
    allocation stays resident (and charged to the daemon's cgroup). Measured with
    tests/host/test_real_vanished_memory.py: malloc's free bytes grew from 4.9 to 12.7 MiB
    over 7 batches of 250 vanished containers while its bytes in use stayed at 5.2-6.4 MiB,
    the inode table at 1281 ids and the Python objects at ~26,800. True if the call was
    made (False without glibc's)."""
    if libc.malloc_trim is None:
        return False
    libc.malloc_trim(0)
    return True
