"""Strict reading of manifest YAML: every key read is marked, and check_all() names each key
no one read, so a field the translator cannot reproduce fails loudly instead of vanishing."""

from __future__ import annotations

from typing import Any


class Untranslatable(ValueError):
    """A manifest field the CRI translation cannot reproduce; the message names its path."""


class Fields:
    """A YAML mapping at a field path (e.g. spec.containers[0]); registered with its Reader."""

    def __init__(self, reader: Reader, data: Any, path: str) -> None:
        if not isinstance(data, dict):
            raise Untranslatable(f"{path}: expected a mapping, got {type(data).__name__}")
        self.reader, self.data, self.path = reader, data, path
        self.seen: set[str] = set()
        reader.registered.append(self)

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def get(self, key: str, default: Any = None) -> Any:
        """A scalar or list of scalars, taken whole."""
        self.seen.add(key)
        return self.data.get(key, default)

    def has(self, key: str) -> bool:
        return key in self.data

    def sub(self, key: str) -> Fields | None:
        self.seen.add(key)
        value = self.data.get(key)
        return None if value is None else Fields(self.reader, value, self.at(key))

    def subs(self, key: str) -> list[Fields]:
        self.seen.add(key)
        value = self.data.get(key) or []
        if not isinstance(value, list):
            raise Untranslatable(f"{self.at(key)}: expected a list")
        return [Fields(self.reader, v, f"{self.at(key)}[{i}]") for i, v in enumerate(value)]

    def accept(self, *keys: str) -> None:
        """Keys whose meaning the harness reproduces by doing nothing (documented at the
        call)."""
        self.seen.update(keys)

    def refuse(self, key: str, why: str) -> None:
        if key in self.data:
            raise Untranslatable(f"{self.at(key)}: {why}")
        self.seen.add(key)

    def fail(self, key: str, why: str) -> Untranslatable:
        return Untranslatable(f"{self.at(key)}: {why}")


class Reader:
    """Owns every Fields made while reading one document set."""

    def __init__(self) -> None:
        self.registered: list[Fields] = []

    def root(self, data: Any, path: str) -> Fields:
        return Fields(self, data, path)

    def check_all(self) -> None:
        for f in self.registered:
            unread = sorted(set(f.data) - f.seen)
            if unread:
                raise Untranslatable(f"{f.at(unread[0])}: not supported by the CRI "
                                     f"translation (tests/support/cri/translate.py)")
