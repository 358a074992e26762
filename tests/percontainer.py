"""A per-container guestfs mount for tests (`MP/<key>/proc/meminfo`, ...): the real
`guestfs mount MP --per-container` when this checkout has it, else an exact emulation: a
tmpfs at MP and, for each container cgroup the test names, a fixed view
`guestfs mount MP/<key> --cgroup PATH` (the same files, the same layout below the key)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

from guestfs import sysmount
from guestfs.containerdirs import dir_key
from tests.fusemount import force_unmount, mounted, require_fuse


def has_per_container_mode() -> bool:
    out = subprocess.run([sys.executable, "-m", "guestfs", "mount", "--help"],
                         capture_output=True, text=True, timeout=60)
    return "--per-container" in out.stdout


class PerContainerMount:
    def __init__(self, mp: str, args: tuple[str, ...], stack: contextlib.ExitStack,
                 real: bool) -> None:
        self.mp, self.args, self.stack, self.real = mp, args, stack, real

    def add(self, cgroup_path: str) -> str:
        """Make sure MP/<key of cgroup_path> serves (a no-op for the real mode, whose
        directories appear on lookup); returns the key."""
        key = dir_key(cgroup_path)
        if not self.real:
            self.stack.enter_context(mounted(os.path.join(self.mp, key), "--cgroup",
                                             cgroup_path, *self.args))
        return key


@contextlib.contextmanager
def per_container_mount(mp: str, *args: str) -> Iterator[PerContainerMount]:
    """A per-container mount at ``mp`` (which must not exist yet, or be an empty dir),
    always unmounted at the end; ``args`` go to every `guestfs mount`."""
    require_fuse()
    os.makedirs(mp, exist_ok=True)
    with contextlib.ExitStack() as stack:
        if has_per_container_mode():
            stack.enter_context(mounted(mp, "--per-container", *args))
            yield PerContainerMount(mp, args, stack, True)
            return
        sysmount.mount("tmpfs", mp, "tmpfs", 0, "mode=755")
        stack.callback(force_unmount, mp)
        yield PerContainerMount(mp, args, stack, False)
