"""Error messages are one line, whatever the paths and values they quote contain."""

from __future__ import annotations

# Control characters (a newline in a mount point, a tab in a limits file) as escapes.
_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(32), 127)} | {10: "\\n", 9: "\\t", 13: "\\r"}


def one_line(text: str) -> str:
    return text.translate(_ESCAPES)
