"""What a tenant can make guestfs log is bounded: a burst per message template per window,
one traceback a window, and the count of what was left out."""

from __future__ import annotations

import io
import logging

from guestfs.system.ratelog import RateLimit


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def logger_with(limit: RateLimit) -> tuple[logging.Logger, io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(limit)
    log = logging.getLogger(f"guestfs.test.ratelog.{id(limit)}")
    log.propagate = False
    log.addHandler(handler)
    return log, out


def test_a_flood_of_one_failure_is_a_burst_one_traceback_and_a_count():
    clock = Clock()
    log, out = logger_with(RateLimit(burst=5, window=60, clock=clock))
    for i in range(10_000):
        try:
            raise ValueError(f"bad pointer {i}")
        except ValueError:
            log.exception("answering syscall %d for %d", 99, i)
    lines = out.getvalue().splitlines()
    assert sum(ln.startswith("answering syscall") for ln in lines) == 5
    assert sum(ln.startswith("Traceback") for ln in lines) == 1
    clock.now = 61
    log.warning("answering syscall %d for %d", 99, 1)
    last = out.getvalue().splitlines()[-1]
    assert last == "answering syscall 99 for 1 (9995 more like this left out in the last 60 s)"


def test_other_messages_are_not_held_back_by_a_flood():
    log, out = logger_with(RateLimit(burst=2, window=60, clock=Clock()))
    for _ in range(100):
        log.warning("flood")
    log.warning("something else")
    assert out.getvalue().splitlines() == ["flood", "flood", "something else"]


def test_the_template_table_is_bounded():
    limit = RateLimit(burst=1, window=60, clock=Clock())
    log, _ = logger_with(limit)
    for i in range(5000):
        log.warning(f"path {i} refused")   # a template per line: a hostile name each
    assert len(limit._seen) <= 1024


def test_info_and_debug_lines_are_never_held_back():
    log, out = logger_with(RateLimit(burst=1, window=60, clock=Clock()))
    log.setLevel(logging.DEBUG)
    for i in range(20):
        log.info("container %d: answering from its own view", i)
    assert len(out.getvalue().splitlines()) == 20
