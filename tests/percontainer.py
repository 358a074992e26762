"""A per-container guestfs mount for tests: `guestfs mount MP --per-container`, serving
`MP/<key>/proc/meminfo` and so on for every container cgroup looked up."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from guestfs.sources.containerdirs import dir_key
from tests.fusemount import mounted, require_fuse


class PerContainerMount:
    def __init__(self, mp: str) -> None:
        self.mp = mp
        self.real = True

    def add(self, cgroup_path: str) -> str:
        """The directory name of ``cgroup_path`` (it appears on lookup)."""
        return dir_key(cgroup_path)


@contextlib.contextmanager
def per_container_mount(mp: str, *args: str) -> Iterator[PerContainerMount]:
    """A per-container mount at ``mp``, always unmounted at the end; ``args`` go to
    `guestfs mount`."""
    require_fuse()
    os.makedirs(mp, exist_ok=True)
    with mounted(mp, "--per-container", *args):
        yield PerContainerMount(mp)
