"""How the engine weighs where numbers came from: each source's say on a limit
(Candidate), the value that won with the ones considered (Resolved), and the rule that
picks it. What a Source is lives with the readings, in sources/provenance.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from guestfs.sources.provenance import Source

T = TypeVar("T")


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
