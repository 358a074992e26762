"""The webhook's log: one JSON object a line on stderr, what log collectors parse without
a pattern."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

log = logging.getLogger("guestfs.webhook")


def event(level: int, name: str, **fields: Any) -> None:
    if log.isEnabledFor(level):
        line = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "level": logging.getLevelName(level).lower(), "event": name, **fields}
        log.log(level, "%s", json.dumps(line, default=str))


def setup_logging(verbose: bool) -> None:
    """The lines are JSON already: nothing is put around them."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(logging.DEBUG if verbose else logging.INFO)
    log.propagate = False
