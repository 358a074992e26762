"""The daemon's core, apart from FUSE: which view a reader gets, caching, per-view state.

For every read the FUSE layer asks render(path, pid). The pid's cgroup names the view;
views are cached for a short TTL (a hit costs no cgroup file reads), and each view keeps
the state that must outlive the cache: /proc/stat counters (monotonic for top and
psutil) and the load average the sampler thread feeds every 5 s.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from cachetools import LRUCache, TTLCache

from guestfs.daemon.daemon_status import STATUS_PATH
from guestfs.daemon.defaults import DEFAULT_CACHE_TTL, DEFAULT_VIEW, VIEWS
from guestfs.daemon.file_table import SERVED_FILES, ViewState, pressure_cgroup, render_file
from guestfs.daemon.readers import CgroupFiles, Reader, ReaderIds
from guestfs.engine.explicit import ExplicitLimitError, ExplicitLimits
from guestfs.engine.limits import EffectiveLimits, effective_limits
from guestfs.render.loadavg import SAMPLE_SECONDS
from guestfs.sources.host_root import HostRoot
from guestfs.sources.proc_cgroup import PidGone, parse_proc_cgroup
from guestfs.sources.snapshot import (
    LIMIT_CONTROLLERS,
    Level,
    Snapshot,
    anchors_alive,
    level_text,
    memberships_for_path,
    snapshot_of,
)
from guestfs.sources.timens import read_boottime_offset
from guestfs.sources.usage import (
    cgroup_age,
    container_incarnation,
    pidns_init,
    pressure_level,
    read_start_ticks,
    read_task_counts,
)
from guestfs.system.oneline import os_error_line

log = logging.getLogger("guestfs.server")

# Rendered afresh on every read, with the CPU counters read at that moment: uptime's first
# field is wall time, top divides process CPU ticks by its deltas, and /proc/stat feeds
# rates (vmstat, mpstat, a Prometheus rate()) that a TTL-old counter pushes past 100 %.
UNCACHED = frozenset({"/proc/uptime", "/proc/stat"})
PINNED = "cgroup:"
FAST_ENTRIES = 16384
MAX_CAUSES = 256
# The files a young view is checked against: the limits runc writes after the cgroup is made.
LIMIT_FILES = frozenset({"memory.limit_in_bytes", "memory.max", "memory.memsw.limit_in_bytes",
                         "memory.swap.max", "cpu.cfs_quota_us", "cpu.cfs_period_us", "cpu.max",
                         "cpuset.cpus", "cpuset.effective_cpus", "cpuset.cpus.effective"})
YOUNG = 0.25  # seconds: a cgroup younger than this may not have its limits written yet (runc
# writes them milliseconds after its init has made its mounts)


class UnseenReader(PermissionError):
    """The reader is not visible to the daemon (another pid namespace, or a /proc that is
    not the daemon's): a per-caller view cannot know its cgroup, so the read is refused
    (EACCES) rather than served the daemon's own or anyone else's numbers."""


@dataclass(frozen=True)
class ServerConfig:
    view: str = DEFAULT_VIEW
    cgroup: str | None = None            # pinned view: this cgroup path, whoever reads
    cache_ttl: float = DEFAULT_CACHE_TTL
    explicit: ExplicitLimits = field(default_factory=ExplicitLimits)
    cpu_rounding: str = "ceil"
    # Re-reads the explicit limits (a downward-API volume, which kubelet rewrites on an
    # in-place resize) at most once per cache_ttl; None: ``explicit`` holds for good.
    reread_explicit: Callable[[], ExplicitLimits] | None = None


@dataclass
class _View:
    snap: Snapshot
    lim: EffectiveLimits
    born: float            # time.monotonic() when its cgroup files were read
    incarnation: object    # identity of the container's cgroup directory
    # The daemon's threads when the view was read: under `guestfs run` they live in the
    # container's cgroup and must not count as its load or running tasks.
    own_threads: frozenset[str] = frozenset()
    # Readings its renders share while it is cached (the container's thread states).
    memo: dict[str, object] = field(default_factory=dict, compare=False)
    # Its cgroup was made less than YOUNG seconds ago: runc makes a container's cgroup,
    # lets its init mount the container's files (binds of ours ask for their sizes, so we
    # render), and writes the limits only after that. Such a view is checked against its
    # limit files at every use, and its renderings are not cached: kept for a TTL as it
    # was, the app's first reads (a JVM sizing its heap) got the node's. Young until this
    # moment (time.monotonic()): a view cached for a TTL grows up while it is cached.
    young_until: float = 0.0
    # Some level is read through a reader's root (sources/reader_root.py: the daemon's
    # own mounts do not show the cgroup, as in a sidecar): the counters read at each
    # render (CPU time for /proc/stat) go through that reader's /proc/<pid>/root.
    anchored: bool = False

    @property
    def young(self) -> bool:
        return time.monotonic() < self.young_until


@dataclass
class _LastingState:
    """What outlives the view cache for one view key (CPU clock, age, load) and the lock
    its renders take."""

    state: ViewState = field(default_factory=lambda: ViewState(sampled=True))
    lock: threading.Lock = field(default_factory=threading.Lock)


def _lost_hierarchies(last: _View | None, new: _View) -> list[str]:
    """Limit controllers whose cgroup was visible in ``last`` and is not in ``new``."""
    if last is None:
        return []
    return [c for c in LIMIT_CONTROLLERS
            if last.snap.hierarchies[c].levels and not new.snap.hierarchies[c].levels]


class ViewServer:
    def __init__(self, host: HostRoot, config: ServerConfig) -> None:
        if config.view not in VIEWS:
            raise ValueError(f"unknown view {config.view!r}; use one of {VIEWS}")
        self.host = host
        self.config = config
        ttl = config.cache_ttl
        self._lock = threading.Lock()
        self._pid_keys: TTLCache[Reader, tuple[str, str]] = TTLCache(8192, ttl)
        self._views: TTLCache[str, _View] = TTLCache(1024, ttl)
        # (view key, path) -> (deadline, bytes); the deadline is the view's birth + TTL.
        self._rendered: TTLCache[tuple[str, str], tuple[float, bytes]] = TTLCache(8192, ttl)
        self._entries: LRUCache[str, _LastingState] = LRUCache(1024)
        self._last_good: LRUCache[tuple[str, str], bytes] = LRUCache(4096)
        self._last_view: LRUCache[str, _View] = LRUCache(1024)
        self.fallbacks: Counter[str] = Counter()
        self._explicit_now, self._explicit_until = config.explicit, time.monotonic() + ttl
        self.refusals: Counter[str] = Counter()   # unseen readers, by cause
        # The hot path: (reader, path) -> (deadline, bytes, view key), a plain dict read
        # without a lock; a hit holds while the reader's cgroups are still the key's.
        self._fast: dict[tuple[Reader, str], tuple[float, bytes, str]] = {}
        self._proc_is_ours = self._check_proc()
        self._reader_ids = ReaderIds(self.start_time, host.root in ("", "/"))
        # The real /proc only: a fake root's files may be replaced under a kept descriptor.
        self._cgroup_files = CgroupFiles(host.path) if host.root in ("", "/") else None
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None
        self.errors = 0
        # How the FUSE layer serves (layout, page cache): shown in the status file.
        self.serving: dict[str, object] = {}
        # Run by the sampler thread every SAMPLE_SECONDS, after the load samples (the
        # per-container layout's sweep of vanished containers).
        self.periodic: list[Callable[[], None]] = []

    # ------------------------------------------------------------ which view

    def _check_proc(self) -> bool:
        """Whether the pids FUSE reports (numbered in the daemon's pid namespace) name the
        same processes in the /proc the daemon reads. A daemon started by `unshare --pid
        --fork` without its own procfs sees its parent namespace's /proc: pid 5 there is
        another process than the reader 5."""
        if self.host.root not in ("", "/"):
            return True  # a fixture root: its pids are the ones the test asks for
        try:
            ours = os.readlink("/proc/self") == str(os.getpid())
        except OSError:
            ours = False
        if not ours:
            log.warning("/proc is not this daemon's pid namespace's: readers cannot be told "
                        "apart, so per-caller reads are refused (use --cgroup or --view self)")
        return ours

    def start_time(self, pid: int) -> int | None:
        return read_start_ticks(self.host, pid)

    def reader(self, pid: int) -> Reader:
        """The reader's identity; pid 0 (FUSE's answer for a reader outside the daemon's pid
        namespace) has none. Fixed views ignore it, so they pay no /proc read."""
        if pid <= 0 or self.fixed_view:
            return (pid, None)
        return self._reader_ids(pid)

    @property
    def fixed_view(self) -> bool:
        return self.config.cgroup is not None or self.config.view == "self"

    def _refuse(self, cause: str, pid: int) -> UnseenReader:
        self.refusals[cause] += 1
        if self.refusals[cause] == 1:
            log.warning("refusing reads (EACCES) from pid %d: %s (logged once per cause)",
                        pid, cause)
        return UnseenReader(f"pid {pid}: {cause}")

    def _candidates(self, pid: int) -> list[str]:
        """Pids whose cgroup names the view, best first. Never the daemon's own: a reader
        it cannot see must not silently get the daemon's numbers."""
        if self.config.view == "init":
            init = pidns_init(self.host, str(pid))
            return [p for p in (init, str(pid)) if p]
        return [str(pid)]

    def key_for(self, pid: int, who: Reader | None = None) -> tuple[str, str]:
        """(view key, pid used). The key is the pid's /proc/<pid>/cgroup text: readers in
        the same cgroups share one view. Raises UnseenReader for a reader the daemon cannot
        see when the view depends on the reader."""
        if self.config.cgroup is not None:
            return PINNED + self.config.cgroup, "self"
        if self.config.view == "self":
            return self._self_key()
        if pid <= 0:
            raise self._refuse("pid 0: the reader is outside the daemon's pid namespace", pid)
        if not self._proc_is_ours:
            raise self._refuse("/proc is not the daemon's pid namespace's", pid)
        who = who if who is not None else self.reader(pid)
        with self._lock:
            hit = self._pid_keys.get(who)
        # A hit is checked against the cgroup file, one small read: a process can change
        # cgroup under one pid and start time (runc's init is made in runc's own cgroup and
        # moved, and the FUSE binds it makes ask for the files' sizes before the move), and
        # a key cached from before would serve it the node's view for a whole TTL.
        if hit is not None and self._cgroup_text(who, hit[1]) == hit[0]:
            return hit
        for cand in self._candidates(pid):
            text = self._cgroup_text(who, cand)
            # Empty is an answer, not an absence: inside gVisor no cgroup is visible.
            if text is None:
                continue
            if self.start_time(pid) != who[1]:
                break  # the reader exited and its pid was reused while we looked
            key = (text, cand)
            with self._lock:
                self._pid_keys[who] = key
            return key
        raise self._refuse("no /proc/<pid>/cgroup for the reader in the daemon's /proc", pid)

    def _cgroup_text(self, who: Reader, pid: str) -> str | None:
        """/proc/<pid>/cgroup: the reader's own through its kept descriptor."""
        if self._cgroup_files is not None and pid == str(who[0]):
            return self._cgroup_files.read(who)
        return self.host.try_read_small(f"/proc/{pid}/cgroup")

    def _self_key(self) -> tuple[str, str]:
        text = self.host.try_read_small("/proc/self/cgroup")
        if text is None:
            raise PidGone("no readable /proc/self/cgroup for the daemon")
        return text, "self"

    def _build_view(self, key: str, pid: str) -> _View:
        # The key is the cgroup membership text itself, so no second read of
        # /proc/<pid>/cgroup (the pid may be gone by now).
        if key.startswith(PINNED):
            memberships = memberships_for_path(self.host, key[len(PINNED):])
        else:
            memberships = parse_proc_cgroup(key)
        born = time.monotonic()
        snap = snapshot_of(self.host, memberships, pid)
        lim = effective_limits(snap, self._explicit(), self.config.cpu_rounding)
        age = cgroup_age(self.host, snap)
        return _View(snap, lim, born, container_incarnation(self.host, snap, lim.cpu_cgroup),
                     self._own_threads(),
                     young_until=born + YOUNG - age if age is not None and age < YOUNG else 0.0,
                     anchored=any(lv.anchor for h in snap.hierarchies.values()
                                  for lv in h.levels))

    def _explicit(self) -> ExplicitLimits:
        """The explicit limits now: the downward API's files as kubelet last wrote them,
        read at most once per TTL; a file gone bad keeps the last good limits, counted."""
        reread = self.config.reread_explicit
        if reread is None:
            return self.config.explicit
        now = time.monotonic()
        with self._lock:
            if now < self._explicit_until:
                return self._explicit_now
        try:
            current = reread()
        except ExplicitLimitError as e:
            self._count_fallback(f"explicit limits unreadable ({e})", "every view",
                                 "keeping the last good explicit limits")
            current = self._explicit_now
        with self._lock:
            self._explicit_now, self._explicit_until = current, now + self.config.cache_ttl
        return current

    def _limits_unchanged(self, view: _View) -> bool:
        """A young view still holds while its leaf's limit files read as they did when it
        was built (a few small reads, where a rebuild reads every level's files)."""
        for c in LIMIT_CONTROLLERS:
            levels = view.snap.hierarchies[c].levels
            if not levels:
                continue
            leaf = levels[0]
            for name, text in leaf.files.items():
                if name in LIMIT_FILES and text is not None and \
                        level_text(self.host, leaf, name) != text:
                    return False
        return True

    def _view(self, key: str, pid: str) -> _View:
        with self._lock:
            view = self._views.get(key)
        if view is not None and view.young and not self._limits_unchanged(view):
            view = None
        if view is not None and view.anchored and not anchors_alive(self.host, view.snap):
            # Built through the root of a reader that has exited (a `cat`): its counters
            # can no longer be read through it, and /proc/stat held the CPU time still
            # (measured in the sidecar pattern: 100 % idle while the container used 10 %
            # of its CPU). Built again through the reader asking now.
            view = None
        if view is None:
            view = self._build_view(key, pid)
            with self._lock:
                last = self._last_view.get(key)
            lost = _lost_hierarchies(last, view)
            if last is not None and lost:
                # The cgroup files that gave this view its limits are unreadable now (a bad
                # mount table, a cgroup being torn down): keep the last good limits, with
                # fresh times, rather than serve the node's size to the pod.
                self._count_fallback(f"cgroup data lost ({', '.join(lost)})", key,
                                     "keeping the view's last good limits")
                view = _View(last.snap, last.lim, view.born, last.incarnation,
                             view.own_threads, young_until=view.young_until)
            else:
                if view.incarnation is None and last is not None:
                    # Its directory could not be looked at (gone between the snapshot and
                    # the stat): not a new container, so the clock carries on.
                    view = _View(view.snap, view.lim, view.born, last.incarnation,
                                 view.own_threads, young_until=view.young_until)
                self._count_unseen(view, key, pid)
            with self._lock:
                self._views[key] = view
                self._last_view[key] = view
        return view

    def _count_unseen(self, view: _View, key: str, pid: str) -> None:
        """A reader whose cgroup neither the daemon's mounts nor its own show gets the
        node's numbers (or only the explicit limits): never in silence."""
        for c in LIMIT_CONTROLLERS:
            h = view.snap.hierarchies[c]
            if h.unseen:
                self._count_fallback(f"{c} cgroup of a reader not visible", f"pid {pid}",
                                     f"serving the node's {c} figures unless an explicit "
                                     f"limit applies ({h.problem})")

    def status_json(self) -> bytes:
        """What `guestfs explain --mount` shows: the fallbacks taken, by cause."""
        import json  # on a read of the status file only, not at every daemon's start

        with self._lock:
            fallbacks = dict(self.fallbacks)
            refusals = dict(self.refusals)
        return (json.dumps({"pid": os.getpid(), "view": self.config.view,
                            "cgroup": self.config.cgroup, "cache_ttl": self.config.cache_ttl,
                            **self.serving, "fallback_total": self.errors,
                            "fallbacks": fallbacks, "refusals": refusals},
                           indent=1) + "\n").encode()

    def _count_fallback(self, cause: str, subject: object, what: str) -> None:
        with self._lock:
            self.errors += 1
            if cause not in self.fallbacks and len(self.fallbacks) >= MAX_CAUSES:
                cause = "other causes (past the first 256)"   # a cause can name a pid
            self.fallbacks[cause] += 1
            first = self.fallbacks[cause] == 1
        if first:
            log.warning("%s for %s; %s (logged once per cause)", cause, subject, what)

    def _entry(self, key: str) -> _LastingState:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _LastingState()
            return entry

    # ------------------------------------------------------------ reads

    def render(self, path: str, pid: int) -> bytes:
        """The bytes served at ``path`` to ``pid``; never raises for bad cgroup input."""
        return self.render_until(path, pid)[1]

    def render_until(self, path: str, pid: int,
                     cgroup: str | None = None) -> tuple[float, bytes]:
        """(deadline, bytes) served at ``path`` to ``pid``: the view of ``cgroup`` when
        given (a per-container directory), else the reader's. The deadline (monotonic) is
        when the bytes stop being fresh: the page-cache path lets the kernel keep them
        until then. Files rendered per read (UNCACHED, the status) are due at once.

        Freshness: every rendering carries the deadline of the view it was made from (the
        moment its cgroup files were read + cache_ttl), and every cache layer keeps it, so
        no number is older than cache_ttl (plus render time) and two readers of one view at
        the same moment get the same bytes."""
        return self.render_for(path, pid, cgroup)[:2]

    def render_for(self, path: str, pid: int, cgroup: str | None = None,
                   who: Reader | None = None) -> tuple[float, bytes, str | None]:
        """render_until's answer and the key of the reader's view it was made from, as
        checked against its cgroup file while rendering (None for a pinned ``cgroup``,
        the status, or a key no longer cached): the caller need not read that file
        again (view_key). ``who``: reader(pid), if the caller has it already."""
        if path == STATUS_PATH:
            return time.monotonic(), self.status_json(), None
        if cgroup is not None:
            return *self._render(path, pid, (pid, None), (PINNED + cgroup, "self")), None
        who = who if who is not None else self.reader(pid)
        hit = self._fast.get((who, path))
        if hit is not None and time.monotonic() < hit[0] and self._same_cgroups(pid, who, hit[2]):
            return hit
        deadline, data = self._render(path, pid, who)
        with self._lock:
            key = self._pid_keys.get(who)
        if key is None:
            return deadline, data, None
        if path not in UNCACHED and self.config.cache_ttl > 0 and deadline > time.monotonic():
            if len(self._fast) > FAST_ENTRIES:
                self._fast.clear()
            self._fast[(who, path)] = (deadline, data, key[0])
        return deadline, data, key[0]

    def pressure_source(self, path: str, pid: int, cgroup: str | None = None
                        ) -> Level | None:
        """Where the pressure file ``path`` served to ``pid`` (or for the per-container
        ``cgroup``) comes from: the cgroup level whose file is served, or None for the
        host's /proc/pressure file. Raises UnseenReader, and OSError for a view that
        cannot be built."""
        who = self.reader(pid)
        key, used = (PINNED + cgroup, "self") if cgroup is not None else \
            self.key_for(pid, who)
        view = self._view(key, used)
        resource = path.rsplit("/", 1)[1]
        return pressure_level(view.snap, resource, pressure_cgroup(view.lim, resource))

    def view_key(self, pid: int, who: Reader | None = None) -> str | None:
        """The key of the view reader ``pid`` gets now (its cgroups, checked against its
        cgroup file); None for a reader refused or gone."""
        try:
            return self.key_for(pid, who)[0]
        except Exception:  # noqa: BLE001 - refused, gone or unreadable: no key
            return None

    def _same_cgroups(self, pid: int, who: Reader, key: str) -> bool:
        try:
            return self.key_for(pid, who)[0] == key
        except Exception:  # noqa: BLE001 - a reader gone or refused: not a hit
            return False

    def _shared(self, key: str, path: str, data: bytes) -> bytes:
        """``data``, or the view's last rendering of ``path`` if it is the same bytes: the
        per-open store (renderings.OpenRenderings) keeps a rendering per open handle, and
        equal renderings as one object cost it one reference each, not one copy (the
        per-caller daemon held 394 copies of meminfo, 591 KiB, after 9,000 reads).
        Called with the lock held."""
        last = self._last_good.get((key, path))
        return last if last is not None and last == data else data

    def _render(self, path: str, pid: int, who: Reader,
                pinned: tuple[str, str] | None = None) -> tuple[float, bytes]:
        try:
            key, used = pinned or self.key_for(pid, who)
        except UnseenReader:
            raise  # refused, never served a fallback
        except Exception as e:  # noqa: BLE001 - a bad cgroup file must not kill the daemon
            return time.monotonic(), self._degraded(path, pid, None, e)
        try:
            if path not in UNCACHED:
                with self._lock:
                    hit = self._rendered.get((key, path))
                if hit is not None and time.monotonic() < hit[0]:
                    return hit
            view = self._view(key, used)
            entry = self._entry(key)
            with entry.lock:
                # A re-created container starts again; render_file begins the view's
                # load at its first read of any file (daemon.file_table.view_load).
                entry.state.follow(view.incarnation)
                # /proc/stat is rendered per read: its btime follows the reader's time
                # namespace (guestfs run gives the app the container's boot clock).
                offset = read_boottime_offset(self.host, pid) if path == "/proc/stat" else 0
                data = render_file(path, self.host, view.snap, view.lim, entry.state,
                                   view.own_threads, view.memo, offset).encode()
            fresh_only = path in UNCACHED or view.young
            due = time.monotonic() if fresh_only else view.born + self.config.cache_ttl
            with self._lock:
                data = self._shared(key, path, data)
                out = (due, data)
                if not fresh_only:
                    self._rendered[(key, path)] = out
                self._last_good[(key, path)] = data
            return out
        except Exception as e:  # noqa: BLE001 - a bad cgroup file must not kill the daemon
            return time.monotonic(), self._degraded(path, pid, key, e)

    def _degraded(self, path: str, pid: int, key: str | None, err: Exception) -> bytes:
        """The last good rendering of this view, so a pod never gets the node's numbers
        because of one bad read; the host's file only for a view never rendered."""
        with self._lock:
            last = self._last_good.get((key, path)) if key is not None else None
        what = "the last good rendering" if last is not None else "the host's file"
        why = os_error_line(err) if isinstance(err, OSError) else \
            f"{type(err).__name__}: {err}"
        self._count_fallback(f"{path}: {why}", f"pid {pid}",
                             f"serving {what}")
        return last if last is not None else self.host.read_text(path).encode()

    def forget(self, cgroup: str) -> None:
        """Drop all that is kept for the view of ``cgroup`` (a per-container directory
        whose container is gone): its views, CPU clock, load and last good renderings."""
        key = PINNED + cgroup
        with self._lock:
            self._views.pop(key, None)
            self._entries.pop(key, None)
            self._last_view.pop(key, None)
            for path in SERVED_FILES:
                self._rendered.pop((key, path), None)
                self._last_good.pop((key, path), None)

    def _own_threads(self) -> frozenset[str]:
        """The daemon's threads: under `guestfs run` they live in the container's cgroup,
        and the load sampler itself is running whenever it counts."""
        if self.host.root not in ("", "/"):
            return frozenset()
        try:
            return frozenset(os.listdir("/proc/self/task"))
        except OSError:
            return frozenset()

    # ------------------------------------------------------------ loadavg sampler

    def sample_loads(self) -> None:
        with self._lock:
            items = list(self._entries.items())
        own = self._own_threads()
        for key, entry in items:
            if entry.state.load is None:
                continue
            try:
                pid = self._sampling_pid(key)
                if pid is None:
                    continue  # the reader it was read through exited; the next read rebuilds
                view = self._view(key, pid)
                if view.incarnation != entry.state.incarnation:
                    continue  # re-created since: the next read starts its load at 0
                tasks = read_task_counts(self.host, view.snap, view.lim.cpu_cgroup, own)
            except (OSError, LookupError, ValueError) as e:
                log.debug("load sample failed: %s", e)
                continue
            if tasks is not None:
                with entry.lock:
                    entry.state.load.sample(tasks.running + tasks.blocked)

    def _sampling_pid(self, key: str) -> str | None:
        """The pid to rebuild an expired view with outside a read: the one it was built
        through, while it runs (a view read through a reader's root needs that reader)."""
        with self._lock:
            cached = self._views.get(key)
            last = self._last_view.get(key)
        if key.startswith(PINNED) or cached is not None or last is None:
            return "self" if cached is None else cached.snap.pid
        return last.snap.pid if anchors_alive(self.host, last.snap) else None

    def start_sampler(self) -> None:
        def loop() -> None:
            while not self._stop.wait(SAMPLE_SECONDS):
                self.sample_loads()
                for task in list(self.periodic):
                    try:
                        task()
                    except Exception:  # noqa: BLE001 - the sampler must outlive a bad sweep
                        log.exception("periodic task failed")
        self._sampler = threading.Thread(target=loop, name="guestfs-loadavg", daemon=True)
        self._sampler.start()

    def stop(self) -> None:
        self._stop.set()
        self._reader_ids.close()
        if self._cgroup_files is not None:
            self._cgroup_files.close()
