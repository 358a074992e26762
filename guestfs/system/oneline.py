"""Error messages are one line, whatever the paths and values they quote contain."""

from __future__ import annotations

import os

# Control characters (a newline in a mount point, a tab in a limits file) as escapes.
_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(32), 127)} | {10: "\\n", 9: "\\t", 13: "\\r"}


def one_line(text: str) -> str:
    return text.translate(_ESCAPES)


def os_error_line(e: OSError) -> str:
    """``e`` as one line a user can read: Python's own rendering of an OSError,
    "[Errno 2] No such file or directory: '/x'", becomes "/x: No such file or directory";
    an OSError raised with a message (``OSError(errno, "what: why")``) is that message.
    A subclass with a __str__ of its own (a one-line reason already) is left as it says."""
    if type(e).__str__ is not OSError.__str__ or e.strerror is None:
        return one_line(str(e))
    names = [os.fsdecode(n) for n in (e.filename, e.filename2) if n is not None]
    return one_line(": ".join([" -> ".join(names), e.strerror] if names else [e.strerror]))
