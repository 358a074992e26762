"""Freshness pushed to the kernel: re-render the page-cached files the kernel holds, and
invalidate a file's inode when its rendering changes (FUSE_NOTIFY_INVAL_INODE).

Polled freshness makes the kernel ask for a file's attributes every 10 ms of reading
(one GETATTR round trip through the daemon each time); pushed, the kernel keeps them for
``valid_for`` seconds and is told when they change. What the kernel holds is known from
what it was told: a file is *watched* from the GETATTR (or LOOKUP) that reported its
attributes until those expire, or until the daemon invalidates them, after which the next
reader's access asks again (and watches it again). So a file nobody reads costs at most
one more rendering after its last read's attributes, a daemon whose files are not read
does not wake at all, and a file the kernel forgot (ENOENT from the notification) is
simply dropped. An EAGAIN from ``invalidate`` (the kernel is still taking in the reply
that named the inode) keeps the file watched and the invalidation is sent again.

At most ``max_entries`` files are watched: past that the least recently watched one is
invalidated instead (the kernel asks again at its next access), so neither memory nor a
tick grows with the number of files read.

Each wake-up renders at most ``batch`` due files, pausing ``pace`` seconds before the
next batch, so thousands of per-container files never hold the interpreter for long
while readers' requests wait.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

log = logging.getLogger("guestfs.fusefs")

# What a refresh found: the bytes changed (published: invalidate), stayed the same, or a
# new rendering was held back because a page fill may be running (try again soon); GONE:
# the file no longer exists (a forgotten container).
CHANGED, SAME, HELD, GONE = "changed", "same", "held", "gone"


@dataclass
class _Watch:
    expires: float      # the kernel's attributes of the file expire then
    due: float          # its rendering's freshness deadline (or a held retry)
    pending: bool = False   # changed, and the kernel not yet told (EAGAIN): tell it


class Pusher:
    """``refresh(path, now)`` renders ``path`` and returns (outcome, next due time);
    ``invalidate(path)`` sends the notification and returns 0 or the errno the kernel
    answered with."""

    def __init__(self, refresh: Callable[[str, float], tuple[str, float]],
                 invalidate: Callable[[str], int], valid_for: float, batch: int = 64,
                 pace: float = 0.01, clock: Callable[[], float] = time.monotonic,
                 max_entries: int = 16384) -> None:
        self._refresh, self._invalidate = refresh, invalidate
        self.valid_for, self.batch, self.pace, self._clock = valid_for, batch, pace, clock
        self.max_entries = max_entries
        self._watched: dict[str, _Watch] = {}   # least recently watched first
        self._evicted: list[str] = []           # to invalidate at the next tick
        self._cond = threading.Condition()
        self._wake_at: float | None = None   # when the thread means to wake; None: idle
        self._stopped = False
        self._dirty = False     # watched since the thread last looked: look again
        self._thread: threading.Thread | None = None
        # Shown in the status file: renderings made by the pusher, inodes invalidated,
        # notifications for inodes the kernel had forgotten, and failed ones.
        self.counts: Counter[str] = Counter(refreshed=0, invalidated=0, forgotten=0,
                                            retried=0, evicted=0, failed=0)

    def __len__(self) -> int:
        return len(self._watched)

    def watched(self) -> list[str]:
        with self._cond:
            return list(self._watched)

    def watch(self, path: str, due: float, now: float | None = None) -> None:
        """The kernel was just given ``path``'s attributes (a rendering fresh until
        ``due``): keep it fresh while they are valid."""
        now = self._clock() if now is None else now
        with self._cond:
            self._watched.pop(path, None)
            self._watched[path] = _Watch(now + self.valid_for, due)
            if len(self._watched) > self.max_entries:
                # Told by the pusher's thread, not this one (a GETATTR being answered):
                # an invalidation may wait for a page fill other workers answer.
                oldest = next(iter(self._watched))
                del self._watched[oldest]
                self._evicted.append(oldest)
                due = now
            self._dirty = True
            # Woken only when it would otherwise sleep past this file's due time.
            if self._wake_at is None or due < self._wake_at:
                self._cond.notify()

    def forget(self, paths: Iterable[str]) -> None:
        with self._cond:
            for path in paths:
                self._watched.pop(path, None)

    def tick(self, now: float) -> float | None:
        """Refresh up to ``batch`` due files; the time to call again, None when nothing
        is watched. The thread's body, and what the tests drive with their own clock."""
        with self._cond:
            evicted, self._evicted = self._evicted, []
            for path in [p for p, w in self._watched.items() if w.expires <= now]:
                del self._watched[path]       # the kernel asks again before using them
            due = sorted((w.due, p) for p, w in self._watched.items() if w.due <= now)
        for path in evicted:
            self._invalidate(path)
            self.counts["evicted"] += 1
        for _, path in due[:self.batch]:
            with self._cond:
                if self._stopped:
                    return None
                watch = self._watched.get(path)
            if watch is not None and watch.pending:
                self._tell(path, now)
            else:
                self._refresh_one(path, now)
        if len(due) > self.batch:
            return now + self.pace
        with self._cond:
            if not self._watched:
                return None
            return min(min(w.due, w.expires) for w in self._watched.values())

    def _refresh_one(self, path: str, now: float) -> None:
        try:
            outcome, next_due = self._refresh(path, now)
        except Exception:  # noqa: BLE001 - one bad rendering must not stop the pushing
            log.exception("refreshing %s failed", path)
            outcome, next_due = SAME, now + self.valid_for
        self.counts["refreshed"] += 1
        if outcome == CHANGED:
            self._tell(path, now)
            return
        with self._cond:
            watch = self._watched.get(path)
            if outcome == GONE:
                self._watched.pop(path, None)
            elif watch is not None:
                # Never at once again: a rendering made just at its view's deadline can
                # come back from a cache that has not expired it yet, due as before.
                watch.due = max(next_due, now + self.pace)

    def _tell(self, path: str, now: float) -> None:
        """Invalidate ``path``'s inode: the kernel asks again at its next access, which
        watches it again."""
        with self._cond:
            watch = self._watched.pop(path, None)
        err = self._invalidate(path)
        if err == 0:
            self.counts["invalidated"] += 1
        elif err == errno.ENOENT:
            self.counts["forgotten"] += 1    # the kernel had dropped the inode
        elif err == errno.EAGAIN:
            self.counts["retried"] += 1
            with self._cond:
                # Even if a GETATTR watched it again meanwhile: that reply may carry the
                # attributes of before the change too.
                watch = self._watched.get(path, watch)
                if watch is not None:
                    watch.pending, watch.due = True, now + self.pace
                    self._watched[path] = watch
        else:
            self.counts["failed"] += 1
            log.debug("FUSE_NOTIFY_INVAL_INODE for %s: %s", path,
                      errno.errorcode.get(err, err))

    # ------------------------------------------------------------ the thread

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="guestfs-push", daemon=True)
        self._thread.start()

    def stop(self, wait: float = 1.0) -> None:
        """No refresh after this returns (one in flight is waited for up to ``wait``
        seconds): the daemon's teardown closes the host files a refresh reads."""
        with self._cond:
            self._stopped = True
            self._watched.clear()
            self._evicted.clear()
            self._cond.notify()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(wait)

    def _loop(self) -> None:
        while True:
            with self._cond:
                if self._stopped:
                    return
            wake_at = self.tick(self._clock())
            with self._cond:
                if self._stopped:
                    return
                if self._dirty:      # a watch came while this thread was ticking
                    self._dirty = False
                    continue
                self._wake_at = wake_at
                # Idle (nothing watched): no timeout, so no wake-up until a GETATTR.
                # Else ``pace`` past the due time: the server's caches expire a view a
                # little after its deadline (they start counting once it is built), and
                # a refresh before that renders nothing new.
                timeout = None if wake_at is None else \
                    max(0.0, wake_at - self._clock()) + self.pace
                self._cond.wait(timeout)
                self._wake_at = None
                self._dirty = False     # the tick that follows sees every watch
                if self._stopped:
                    return
