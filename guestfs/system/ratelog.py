"""Rate-limited logging: what a tenant can make guestfs log must not grow without bound.

An app under `guestfs run` or a reader of a shared mount can make the same failure happen
thousands of times a second (a bad pointer to sysinfo(2), a stopped daemon, a hostile
path); each would otherwise be a line, with a traceback, in the pod's log. Per message
template (the logger's name and the unformatted message) of a warning or worse, the first
BURST records of every WINDOW seconds pass, only the first with its traceback; the rest
are counted, and the next record that passes says how many were left out. INFO and DEBUG
lines are events of guestfs's own making (a container served, a mount made), never held
back: -v asks for all of them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict

BURST = 5
WINDOW = 60.0
MAX_TEMPLATES = 1024


class RateLimit(logging.Filter):
    def __init__(self, burst: int = BURST, window: float = WINDOW,
                 clock=time.monotonic) -> None:
        super().__init__()
        self.burst, self.window, self.clock = burst, window, clock
        self._lock = threading.Lock()
        # template -> [window start, records passed in it, records left out since last pass]
        self._seen: OrderedDict[tuple[str, str], list[float]] = OrderedDict()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key = (record.name, str(record.msg))
        now = self.clock()
        with self._lock:
            st = self._seen.get(key)
            if st is None or now - st[0] >= self.window:
                dropped = int(st[2]) if st else 0
                self._seen[key] = st = [now, 0, 0]
                self._seen.move_to_end(key)
                while len(self._seen) > MAX_TEMPLATES:
                    self._seen.popitem(last=False)
                if dropped:
                    record.msg = (f"{record.msg} ({dropped} more like this left out in the "
                                  f"last {self.window:g} s)")
            st[1] += 1
            if st[1] > self.burst:
                st[2] += 1
                return False
            if st[1] > 1:
                record.exc_info, record.exc_text = None, None   # one traceback a window
        return True


def install(handler: logging.Handler) -> None:
    handler.addFilter(RateLimit())
