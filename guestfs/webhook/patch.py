"""JSONPatch (RFC 6902) operations, and RFC 6901 pointers to the fields they change."""

from __future__ import annotations

from typing import Any


def escape(token: str) -> str:
    """One reference token of a JSON pointer: "~" and "/" escaped, in that order (an
    annotation key such as io.guestfs/x is one token)."""
    return token.replace("~", "~0").replace("/", "~1")


def pointer(*tokens: str | int) -> str:
    return "".join("/" + escape(str(t)) for t in tokens)


def add(path: str, value: Any) -> dict[str, Any]:
    return {"op": "add", "path": path, "value": value}


def append(parent: dict, key: str, at: tuple[str | int, ...], items: list[Any]) -> list[dict]:
    """Operations adding ``items`` to the list ``parent[key]`` (whose pointer is ``at``):
    one "add" of the whole list where there is none yet (a "-" into a missing list is an
    error), else one "add .../-" per item, so that the list's own items are kept."""
    if not items:
        return []
    if not isinstance(parent.get(key), list):
        return [add(pointer(*at), list(items))]
    return [add(pointer(*at, "-"), item) for item in items]
