"""Where a number came from: the vocabulary shared by the engine, explain and show."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

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


@dataclass(frozen=True)
class Candidate(Generic[T]):
    """One source's say on a limit; value None means "no limit here"."""

    value: T | None
    source: Source


@dataclass(frozen=True)
class Resolved(Generic[T]):
    value: T
    source: Source
    limited: bool                               # False: the host's own value stands
    considered: tuple[Candidate[T], ...] = ()


def pick_min(candidates: list[Candidate[T]]) -> int | None:
    """Index of the smallest limit; on ties the *later* candidate wins.

    Callers order candidates from least to most explanatory (explicit settings, then the
    leaf, then each ancestor), so a tie names the highest cgroup level that binds, whose
    usage includes the leaf's.
    """
    best: int | None = None
    for i, c in enumerate(candidates):
        if c.value is None:
            continue
        if best is None or c.value <= candidates[best].value:  # type: ignore[operator]
            best = i
    return best
