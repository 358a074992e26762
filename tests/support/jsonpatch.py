"""An RFC 6902 JSONPatch applier over RFC 6901 pointers, for the tests that apply the
webhook's patch as the API server does: every operation (add, remove, replace, move,
copy, test), applied to a copy, all or nothing; an invalid one raises PatchError."""

from __future__ import annotations

import copy
from typing import Any


class PatchError(ValueError):
    pass


def tokens(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise PatchError(f"{pointer!r}: a pointer starts with /")
    out = []
    for raw in pointer[1:].split("/"):
        if "~" in raw.replace("~0", "").replace("~1", ""):
            raise PatchError(f"{pointer!r}: bad escape in {raw!r}")
        out.append(raw.replace("~1", "/").replace("~0", "~"))
    return out


def _index(container: list, token: str, adding: bool) -> int:
    if token == "-" and adding:
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise PatchError(f"{token!r} is not an array index")
    i = int(token)
    if i > len(container) or (i == len(container) and not adding):
        raise PatchError(f"index {i} out of range ({len(container)} items)")
    return i


def _parent(doc: Any, pointer: str) -> tuple[Any, str]:
    parts = tokens(pointer)
    if not parts:
        raise PatchError("the root has no parent")
    node = doc
    for t in parts[:-1]:
        node = _child(node, t)
    return node, parts[-1]


def _child(node: Any, token: str) -> Any:
    if isinstance(node, dict):
        if token not in node:
            raise PatchError(f"no member {token!r}")
        return node[token]
    if isinstance(node, list):
        return node[_index(node, token, adding=False)]
    raise PatchError(f"cannot descend into {type(node).__name__} at {token!r}")


def get(doc: Any, pointer: str) -> Any:
    node = doc
    for t in tokens(pointer):
        node = _child(node, t)
    return node


def _add(doc: Any, pointer: str, value: Any) -> Any:
    if pointer == "":
        return value
    parent, last = _parent(doc, pointer)
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, adding=True), value)
    else:
        raise PatchError(f"cannot add into {type(parent).__name__}")
    return doc


def _remove(doc: Any, pointer: str) -> Any:
    parent, last = _parent(doc, pointer)
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"no member {last!r} to remove")
        return parent.pop(last)
    if isinstance(parent, list):
        return parent.pop(_index(parent, last, adding=False))
    raise PatchError(f"cannot remove from {type(parent).__name__}")


def apply(doc: Any, ops: list[dict[str, Any]]) -> Any:
    out = copy.deepcopy(doc)
    for op in ops:
        kind, path = op.get("op"), op.get("path")
        if not isinstance(path, str):
            raise PatchError(f"{op}: no path")
        if kind == "add":
            out = _add(out, path, copy.deepcopy(op["value"]))
        elif kind == "remove":
            _remove(out, path)
        elif kind == "replace":
            get(out, path)
            if path == "":
                out = copy.deepcopy(op["value"])
            else:
                _remove(out, path)
                out = _add(out, path, copy.deepcopy(op["value"]))
        elif kind in ("move", "copy"):
            source = op["from"]
            if kind == "move" and (path + "/").startswith(source + "/") and path != source:
                raise PatchError(f"cannot move {source} into its own child {path}")
            value = copy.deepcopy(get(out, source))
            if kind == "move":
                _remove(out, source)
            out = _add(out, path, value)
        elif kind == "test":
            if get(out, path) != op["value"]:
                raise PatchError(f"test failed at {path}")
        else:
            raise PatchError(f"unknown op {kind!r}")
    return out
