"""Where a number came from: the vocabulary shared by the sources, the engine, explain and
show. A Source names the kind of origin and, for a file, its host path and cgroup level."""

from __future__ import annotations

from dataclasses import dataclass

# Source kinds, in the words explain prints and the JSON carries (docs/explain-json.md).
CGROUP = "cgroup"                 # an interface file at one cgroup level
CGROUP_HIERARCHICAL = "cgroup-hierarchical"  # v1 memory.stat hierarchical_* (all ancestors)
OPTION = "option"                 # --memory-limit / --cpu-limit
ENV = "env"                       # GUESTFS_MEMORY_LIMIT / GUESTFS_CPU_LIMIT
DOWNWARD_API = "downward-api"     # --limits-dir files
HOST = "host"                     # the host's own total: nothing limits it


@dataclass(frozen=True)
class Source:
    kind: str
    file: str | None = None       # host path of the file read (or env var name)
    cgroup: str | None = None     # cgroup level, as /proc/<pid>/cgroup names it
    note: str | None = None

    def describe(self) -> str:
        parts = [self.kind]
        if self.file:
            parts.append(self.file)
        if self.cgroup is not None:
            parts.append(f"(cgroup {self.cgroup})")
        if self.note:
            parts.append(f"[{self.note}]")
        return " ".join(parts)

    def to_json(self) -> dict[str, str | None]:
        return {"kind": self.kind, "file": self.file, "cgroup": self.cgroup, "note": self.note}
