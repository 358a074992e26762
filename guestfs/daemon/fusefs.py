"""The FUSE operations: a thin layer from paths and file handles to ViewServer.render.

Layout under the mount point is LXCFS's, so its recipes work with the path changed:
proc/{meminfo,...}, proc/pressure/{cpu,memory,io}, sys/devices/system/cpu/{online,...};
a --per-container mount has that layout once per container, under MOUNT/<key>/.

Two ways of serving (docs/mount.md, "How reads are served"):
- per caller (the LXCFS-style shared mount): every open and read reaches the daemon
  (direct_io), which answers each reader with its own container's numbers; attributes
  are not cached, so each open's GETATTR sizes the file by the opener's own rendering,
  which that open then serves (reported_size: sendfile, splice and mmap stop at it);
- page cache (a fixed view, or a per-container directory: every reader of a file gets the
  same bytes): open answers ENOSYS, so the kernel stops sending OPEN for the connection
  (no_open) and serves reads from its page cache. Freshness is polled or pushed:
  - polled (libfuse): the daemon renders on the GETATTR that follows the 10 ms attribute
    timeout once the rendering's freshness deadline has passed, and a new mtime makes the
    kernel drop the old pages;
  - pushed (guestfs's engine, which can send notifications): attributes are kept for
    PUSHED_VALID, the daemon re-renders the files the kernel holds as their deadlines
    pass and invalidates a file's inode when its bytes change (daemon/pusher.py); files
    rendered per read (/proc/stat, uptime, the status) are still polled.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import stat
import threading
import time
from collections import Counter
from collections.abc import Callable
from types import ModuleType
from typing import Any

from guestfs.daemon.daemon_status import STATUS_PATH
from guestfs.daemon.kernel_entries import EntryDropper
from guestfs.daemon.lowmem import release_free_heap
from guestfs.daemon.psi_triggers import NO_TRIGGER, Keeper, Triggers
from guestfs.daemon.pusher import CHANGED, GONE, HELD, SAME, Pusher
from guestfs.daemon.renderings import (
    Generation,
    Generations,
    OpenRenderings,
    SizedRenderings,
)
from guestfs.daemon.server import UNCACHED, UnseenReader, ViewServer
from guestfs.fuse.abi import DEFAULT_POLLMASK
from guestfs.render.served import PRESSURE_FILES, SERVED_FILES
from guestfs.sources.containerdirs import (
    BadKey,
    cgroup_exists,
    existing_cgroups,
    path_of_key,
    process_keys,
)
from guestfs.sources.snapshot import Level

DIR_MODE = stat.S_IFDIR | 0o555
FILE_MODE = stat.S_IFREG | 0o444
# A pressure file that takes PSI triggers: writable by all, as the kernel's /proc/pressure
# files are (a reader gets no right it had not: the trigger lands on its own cgroup's
# file, created by a daemon without CAP_SYS_RESOURCE, so with an unprivileged trigger's
# limits).
TRIGGER_MODE = stat.S_IFREG | 0o666
SIZED_ENTRIES = 4096
# A per-container directory whose cgroup is gone keeps its last good numbers (counted as
# a fallback) this long, for a reader that outlives its container by a moment; then it is
# forgotten (ENOENT). At most MAX_VANISHED of them are kept, the longest gone forgotten
# first: each kept ~45 KB (its files' renderings, view, clock), and a node that removed
# thousands of short jobs' cgroups grew the DaemonSet's daemon past its 128Mi
# (tests/test_real_vanished_memory.py prints the cost of each).
VANISHED_GRACE = 30.0
MAX_VANISHED = 64
LAYOUTS = ("per-caller", "fixed", "per-container")
# How long the kernel may keep a page-cached file's attributes (and so its pages) before
# it asks again: one GETATTR per file per 10 ms at most, whoever reads. Files rendered per
# read (/proc/stat, uptime) are then at most 10 ms old, the resolution (USER_HZ) of the
# counters /proc/stat itself shows; the others change when their view expires
# (--cache-ttl), so a changed limit shows within --cache-ttl + 10 ms. One value for every
# file, set once at start: libfuse3 sends the same attribute timeout with every reply.
REVALIDATE = 0.01
DIRECTORY_VALID = 0.5  # attributes of the per-caller layout's directories
# Pushed freshness (guestfs's engine): how long the kernel keeps a page-cached file's
# attributes and entries, since the daemon tells it when a rendering changes. What it
# still bounds: a file read without pause is rendered once more per PUSHED_VALID even
# when unchanged; a daemon's pushing stops that long after the last read; and after a
# daemon without a holder dies, its last renderings may be served that long before
# readers get "Transport endpoint is not connected".
PUSHED_VALID = 5.0
# libfuse3's capability bits (fuse_common.h): the kernel offers no_open since Linux 3.14;
# libfuse3 wants auto_inval_data by default wherever it is offered.
CAP_AUTO_INVAL_DATA = 1 << 12
CAP_NO_OPEN_SUPPORT = 1 << 17
CALL_KINDS = ("getattr", "open", "read", "readdir", "render")
PAGE = 4096

log = logging.getLogger("guestfs.fusefs")


def reported_size(data: bytes) -> int:
    """st_size of a file served through the daemon (direct_io), for the reader ``data``
    was rendered for: its length rounded up to whole pages, at least one.

    Why a size at all, when direct_io reads ignore it: sendfile(2) and splice(2) (busybox
    ``cat``) read a FUSE file through the page cache even with direct_io
    (filemap_splice_read), up to i_size only, so a size of 0 read nothing; a private mmap
    faults pages in below i_size only; Node's readFile sizes its buffer by st_size and
    stops there. Why this size: it holds the whole rendering the same reader then reads
    (the GETATTR of its open rendered it, and the open serves exactly that rendering), and
    the content ends in its last page, so a mapping of st_size touched to its end never
    reaches a page past the content (SIGBUS). The short READ that fills the page lowers
    the kernel's i_size to the content's end (fuse_short_read), so sendfile stops there,
    not at the zeros after it. Whole pages rather than the exact length because the inode,
    its page cache and its i_size are shared by every reader of the mount: the page a
    mapping shows may have been filled by another reader's open with a longer rendering,
    which a mapping of the exact length (its fstat) would cut (measured with four
    concurrent mappers of /proc/stat, tests/readkit/mapper.py: 19 to 52 of each 3000
    mappings cut with exact sizes, none with whole pages)."""
    return max(PAGE, -(-len(data) // PAGE) * PAGE)


def _tree() -> tuple[dict[str, list[str]], set[str]]:
    dirs: dict[str, list[str]] = {"/": []}
    for f in SERVED_FILES:
        parts = f.strip("/").split("/")
        for depth in range(1, len(parts) + 1):
            parent = "/" + "/".join(parts[: depth - 1]) if depth > 1 else "/"
            child = "/" + "/".join(parts[:depth])
            if parts[depth - 1] not in dirs[parent]:
                dirs[parent].append(parts[depth - 1])
            if depth < len(parts):
                dirs.setdefault(child, [])
    # The daemon's own status (fallback counts) sits at the root, beside LXCFS's layout.
    dirs["/"].append(STATUS_PATH.lstrip("/"))
    return dirs, {*SERVED_FILES, STATUS_PATH}


def make_operations(fuse: ModuleType, server: ViewServer, layout: str = "per-caller",
                    direct_timeout: float = 0.5,
                    on_init: Callable[[], None] | None = None) -> Any:
    """GuestOperations for the binding module ``fuse`` (fusepy or mfusepy): an instance of
    a class made of it and the binding's Operations, whose defaults (and __call__, through
    which the binding dispatches) it overrides."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}")
    cls = type("GuestFS", (GuestOperations, fuse.Operations), {})
    return cls(fuse, server, layout, direct_timeout, on_init)


class GuestOperations:
    """The FUSE callbacks, written against the fusepy/mfusepy API; make_operations gives
    them the binding's Operations class as a base. ``layout``: "per-caller" (LXCFS's
    layout, each reader its own view, direct_io), "fixed" (LXCFS's layout, one view for
    every reader, page-cached where libfuse3's init says the kernel's client offers
    no_open and auto_inval_data) or "per-container" (one directory per container cgroup,
    page-cached likewise). ``direct_timeout`` is the attribute timeout to fall back to
    when the page cache cannot be used. ``on_init`` is called once libfuse has the
    kernel's INIT (the mount serves from then on)."""

    use_ns = True

    def __init__(self, fuse: ModuleType, server: ViewServer, layout: str,
                 direct_timeout: float, on_init: Callable[[], None] | None) -> None:
        self._fuse, self._server, self.layout = fuse, server, layout
        self._direct_timeout, self._on_init = direct_timeout, on_init
        self.initialised = threading.Event()   # the kernel's INIT is answered: it serves
        self.per_container = layout == "per-container"
        self._dirs, self._files = _tree()
        self._t = time.time_ns()  # every directory carries the mount's start time
        self._per_handle = OpenRenderings()
        # next() on a count is atomic in CPython. Handles from the pid up: a successor
        # on a held connection (daemon/held.py) must not give a new open the number of
        # a handle its predecessor gave a reader still reading.
        self._next = itertools.count((os.getpid() << 32) + 1)
        # Served through the daemon, a GETATTR by path (a stat, or the permission check
        # of an open: attributes are never cached there, daemon/mount.py) renders the
        # file for the asking reader and reports that rendering's size (reported_size);
        # the open that follows in the same thread takes it, so what is read is what
        # was sized.
        self._sized = SizedRenderings(SIZED_ENTRIES)
        # The page cache path: decided in init (it needs libfuse3's config) and
        # turned off again if the FUSE client does not honour no_open (probe).
        self.page_cache = False
        self.generations = Generations()
        self._config: Any = None
        self._known: dict[str, str] = {}   # per-container: key -> cgroup path
        self._gone: dict[str, float] = {}  # key -> when its cgroup was first seen gone
        self._dropper = EntryDropper(fuse)
        # Pushed freshness: set up by use_notifier (guestfs's engine) on a page-cached
        # layout; None while polled.
        self.pusher: Pusher | None = None
        # PSI triggers (guestfs's engine, per-caller layout): the file a trigger is written
        # to (psi_triggers.open_source, given by the daemon), and the open trigger files.
        self.trigger_source: Callable[[Level | None, str], int] | None = None
        self.triggers: Triggers | None = None
        # A held mount's (mount.py): the holder, told every trigger's state, and what a
        # predecessor left with it (held.Lease.kept).
        self.trigger_keeper: Keeper | None = None
        self.adopted_triggers: list[tuple[int, bytes, int]] = []
        self._notifier: Any = None
        self._polled_entry_timeout: float | None = None
        # Vanished containers forgotten, and of those whose kernel entry was dropped.
        self.vanished = Counter(forgotten=0, entries_dropped=0)
        # Called after a sweep forgot containers: what they used is freed, and this hands
        # the heap's free pages back (lowmem.release_free_heap says why it must).
        self.release_heap: Callable[[], object] = release_free_heap
        if self.per_container:
            server.serving["vanished"] = self.vanished
            server.periodic.append(self.forget_vanished)
        # FUSE requests that reached Python, by kind (the status file shows them; a
        # page-cached read must add none). Every key exists from the start: the status
        # is rendered while other threads count.
        self.calls: Counter[str] = Counter(dict.fromkeys(CALL_KINDS, 0))
        server.serving["callbacks"] = self.calls
        # Whether the kernel accepts an idmapped bind of this mount (kubelet makes one
        # for every hostPath of a pod with hostUsers: false); known at INIT.
        server.serving["idmapped_binds"] = False

    @property
    def kept_renderings(self) -> OpenRenderings:
        return self._per_handle

    def known_paths(self) -> list[str]:
        """Every path this mount may serve, for a successor naming its predecessor's node
        ids: the layout's tree, under every running container's key per container."""
        tree = [*self._dirs, *self._files]
        if not self.per_container:
            return tree
        keys = dict.fromkeys([*self._known, *process_keys(self._server.host)])
        return [STATUS_PATH, *(f"/{key}{'' if p == '/' else p}" for key in keys
                               for p in tree if p != STATUS_PATH)]

    @property
    def probe_path(self) -> str:
        """A file every layout serves at the mount's root, to see that it serves."""
        return STATUS_PATH if self.per_container else "/sys/devices/system/cpu/online"

    # A fresh exception per raise: one shared instance grows its __traceback__ by a frame
    # chain on every raise, forever (~2 KB per failed lookup, which any reader can cause).
    def _error(self, code: int) -> Exception:
        return self._fuse.FuseOSError(code)  # type: ignore[no-any-return]

    def _render(self, path: str, cgroup: str | None) -> tuple[float, bytes]:
        self.calls["render"] += 1
        try:
            return self._server.render_until(path, self._fuse.fuse_get_context()[2], cgroup)
        except UnseenReader:
            # The server counted and logged it; the reader gets a plain permission error.
            raise self._error(errno.EACCES) from None

    # ------------------------------------------------------------ setup

    def init(self, path: str) -> None:
        # fusepy's (libfuse2) only; mfusepy calls init_with_config instead.
        self._note_idmap(None)
        self._initialised()

    def init_with_config(self, conn: Any, config: Any) -> None:
        self._note_idmap(conn)
        self._configure(conn, config)
        self._initialised()

    def _initialised(self) -> None:
        self.initialised.set()
        if self._on_init is not None:
            self._on_init()

    def _note_idmap(self, conn: Any) -> None:
        # Only guestfs's engine can negotiate FUSE_ALLOW_IDMAP (its ConnInfo says so);
        # libfuse's fuse_conn_info has no such field, and without it the kernel refuses
        # an idmapped bind with EINVAL: a user-namespaced pod does not even start.
        idmap = bool(getattr(conn, "idmap", False))
        self._server.serving["idmapped_binds"] = idmap
        if not idmap:
            log.info("idmapped binds of this mount (pods with hostUsers: false) are "
                     "refused: they need guestfs's FUSE engine (--fuse-binding auto or guestfs, "
                     "or --hold) and Linux 6.12 or later")

    def _configure(self, conn: Any, config: Any) -> None:
        # libfuse3 says here what the kernel's FUSE client offers (libfuse2 gives no
        # config: the page cache path is not taken there).
        if self.per_container:
            self._dropper.capture()
        if config is None or self.layout == "per-caller":
            return
        self._config = config
        capable = int(getattr(conn, "capable", 0) or 0)
        want = int(getattr(conn, "want", 0) or 0)
        missing = [name for name, bit, mask in (
            ("no_open", CAP_NO_OPEN_SUPPORT, capable),
            ("auto_inval_data", CAP_AUTO_INVAL_DATA, want)) if not mask & bit]
        if missing:
            # gVisor's FUSE client offers neither: there an ENOSYS from open fails
            # the reader instead of turning OPEN off, and nothing would drop stale
            # pages. Served through the daemon, as on libfuse2.
            self.disable_page_cache(f"this FUSE client lacks {' and '.join(missing)}")
            return
        self.page_cache = True

    def disable_page_cache(self, why: str) -> None:
        """Back to direct_io and per-open renderings (a client without no_open)."""
        self.page_cache = False
        self._server.serving["page_cache"] = False
        self._stop_pushing()
        if self._config is not None:
            self._config.attr_timeout = self._direct_timeout
        log.warning("%s: serving every read through the daemon (direct_io)", why)

    # ------------------------------------------------------------ pushed freshness

    def use_notifier(self, notifier: Any) -> None:
        """guestfs's engine can notify the kernel (fuse/adapter.py's Notifier): a
        page-cached layout then pushes its freshness instead of having it polled. Not
        with a --cache-ttl at or below the polling period: pushing would render more
        often than polling asks."""
        self._notifier = notifier
        self._take_triggers(notifier)
        if not self.page_cache or self._server.config.cache_ttl <= REVALIDATE \
                or self.pusher is not None:
            return
        self.pusher = Pusher(self._refresh, notifier.inval_inode, PUSHED_VALID)
        self._server.serving["push"] = self.pusher.counts
        if self._config is not None:
            # Entries too: a walk to a file whose entry expired is a LOOKUP, answered
            # with a rendering like a GETATTR.
            self._polled_entry_timeout = self._config.entry_timeout
            self._config.entry_timeout = max(self._config.entry_timeout, PUSHED_VALID)
        self.pusher.start()
        log.info("page-cached files: freshness pushed (FUSE_NOTIFY_INVAL_INODE), "
                 "attributes kept %gs", PUSHED_VALID)

    def stop(self) -> None:
        """The FUSE loop has ended: nothing is rendered behind the teardown's back (it
        closes the host files; a refresh then would log EBADF as a fallback), and the
        triggers' descriptors are closed."""
        self._stop_pushing()
        if self.triggers is not None:
            self.triggers.stop()

    # ------------------------------------------------------------ PSI triggers

    def _take_triggers(self, notifier: Any) -> None:
        """Where every open reaches the daemon (no page cache), with somewhere to write
        triggers to: a pressure file opened for writing takes one (psi_triggers.py)."""
        kept, self.adopted_triggers = self.adopted_triggers, []
        if self.page_cache or self.per_container or self.trigger_source is None \
                or self.triggers is not None:
            for _, _, fd in kept:
                os.close(fd)
            return
        self.triggers = Triggers(notifier.poll, keeper=self.trigger_keeper)
        self._server.serving["psi_triggers"] = self.triggers.counts
        # An instance attribute, for guestfs's engine only: a libfuse binding registers
        # the class's callbacks. (release too, once a trigger is open.)
        self.write = self._write_trigger
        log.info("pressure files take PSI triggers (write, then poll for POLLPRI)")
        if kept:
            self.triggers.adopt(kept)
            self.release = self._release_trigger
            log.info("%d PSI triggers kept from the previous daemon", len(self.triggers))

    def _open_trigger(self, fh: int, sub: str, cgroup: str | None) -> None:
        assert self.triggers is not None and self.trigger_source is not None
        pid = self._fuse.fuse_get_context()[2]
        try:
            level = self._server.pressure_source(sub, pid, cgroup)
            fd = self.trigger_source(level, sub.rsplit("/", 1)[1])
        except UnseenReader:
            raise self._error(errno.EACCES) from None
        except OSError as e:
            log.debug("no PSI trigger file for %s (pid %d): %s", sub, pid, e)
            raise self._error(e.errno if isinstance(e.errno, int) and e.errno > 0
                              else errno.EIO) from None
        self.triggers.add(fh, fd, cgroup or self._server.view_key(pid) or "")
        # From the first trigger on, every RELEASE reaches this object (a reader who
        # never writes one costs no call per close).
        self.release = self._release_trigger

    def _write_trigger(self, path: str, data: bytes, offset: int, fi: Any) -> int:
        if self.triggers is None or fi.fh not in self.triggers:
            raise self._error(errno.EBADF)
        return self.triggers.write(fi.fh, data)

    def _release_trigger(self, path: str, fi: Any) -> None:
        if self.triggers is not None:
            self.triggers.release(fi.fh)

    def poll_events(self, path: str, fi: Any, kh: int | None, events: int) -> int:
        """guestfs's engine's POLL (adapter.OperationsFilesystem.poll): a trigger file's
        state; a pressure file without a trigger polls as the kernel's does (POLLERR and
        POLLPRI: "no trigger"), any other file as one without poll support."""
        if self.triggers is not None and fi.fh in self.triggers:
            return self.triggers.poll(fi.fh, kh)
        return NO_TRIGGER if self._split(path)[1] in PRESSURE_FILES else DEFAULT_POLLMASK

    def _stop_pushing(self) -> None:
        if self.pusher is None:
            return
        self.pusher.stop()
        self.pusher = None
        self._server.serving.pop("push", None)
        if self._config is not None and self._polled_entry_timeout is not None:
            self._config.entry_timeout = self._polled_entry_timeout

    def _rendered_per_read(self, path: str) -> bool:
        if path == STATUS_PATH:
            return True
        sub = path.partition("/")[2].partition("/")[2] if self.per_container else path[1:]
        return f"/{sub}" in UNCACHED

    def attr_valid(self, path: str) -> float | None:
        """The attribute timeout of ``path``'s replies (guestfs's engine asks): polled
        for the files rendered per read, PUSHED_VALID for the rest (and directories)
        while pushing; DIRECTORY_VALID for the directories of a layout served through
        the daemon; else the one timeout of the config."""
        if self.pusher is None:
            if not self.page_cache and not self.per_container and self._is_dir(None, path):
                # The per-caller layout's directories never change, but with
                # default_permissions every walk through one asks for its attributes:
                # kept, they save two GETATTRs of each open of MP/proc/<file>.
                return DIRECTORY_VALID
            return None
        return REVALIDATE if self._rendered_per_read(path) else PUSHED_VALID

    def _refresh(self, path: str, now: float) -> tuple[str, float]:
        """The pusher's rendering of a watched file: (what changed, when it is next
        due)."""
        try:
            cgroup, sub = self._split(path)
        except OSError:
            return GONE, now           # a per-container key no longer served
        old = self.generations.get(path)
        deadline, data = self._render(sub, cgroup)
        gen, held = self.generations.offer(path, deadline, data, now)
        if held:
            return HELD, now + self.generations.hold
        return (SAME if gen is old else CHANGED), gen.deadline

    # ------------------------------------------------------------ vanished containers

    def forget_vanished(self, now: float | None = None) -> None:
        """Mark the containers whose cgroup is gone and forget those gone for longer
        than VANISHED_GRACE, and the longest gone beyond MAX_VANISHED (run every 5 s
        by the server's sampler). A cgroup made again in time is served on."""
        now = time.monotonic() if now is None else now
        known = list(self._known.items())
        alive = existing_cgroups(self._server.host, [cg for _, cg in known])
        for key, cgroup in known:
            if cgroup in alive:
                self._gone.pop(key, None)
            else:
                self._gone.setdefault(key, now)
        by_age = sorted(self._gone, key=self._gone.__getitem__)
        excess = max(0, len(by_age) - MAX_VANISHED)
        forgot = 0
        for i, key in enumerate(by_age):
            if i < excess or now - self._gone[key] >= VANISHED_GRACE:
                self._forget(key)
                forgot += 1
        if forgot:
            # Once per sweep that forgot any (at most every 5 s, on a node whose
            # containers come and go), not per container: a trim walks the whole heap.
            self.release_heap()

    def _forget(self, key: str) -> None:
        self._gone.pop(key, None)
        cgroup = self._known.pop(key, None)
        self.generations.forget(f"/{key}{f}" for f in self._files)
        if self.pusher is not None:
            self.pusher.forget(f"/{key}{f}" for f in self._files)
        if cgroup is not None:
            self._server.forget(cgroup)
        self.vanished["forgotten"] += 1
        # guestfs's engine notifies itself; with libfuse3, through libfuse's session.
        dropped = self._notifier.inval_entry("/", key) == 0 if self._notifier is not None \
            else self._dropper.drop(key)
        if dropped:
            self.vanished["entries_dropped"] += 1

    # ------------------------------------------------------------ paths

    def _split(self, path: str) -> tuple[str | None, str]:
        """(cgroup of the per-container directory or None, path in the layout)."""
        if not self.per_container or path in ("/", STATUS_PATH):
            return None, path
        key, _, rest = path[1:].partition("/")
        cgroup = self._known.get(key)
        if cgroup is None:
            try:
                cgroup = path_of_key(key)
            except BadKey:
                raise self._error(errno.ENOENT) from None
            # Created on demand: a lookup of a container's key serves it while its
            # cgroup exists; bounded, as a lookup of every name must not grow us.
            if not cgroup_exists(self._server.host, cgroup):
                raise self._error(errno.ENOENT)
            if len(self._known) >= SIZED_ENTRIES:
                self._known.pop(next(iter(self._known)))
            self._known[key] = cgroup
        return cgroup, "/" + rest

    def _is_dir(self, cgroup: str | None, sub: str) -> bool:
        if self.per_container and cgroup is None:
            return sub == "/"
        return sub in self._dirs and sub != STATUS_PATH

    def _is_file(self, cgroup: str | None, sub: str) -> bool:
        if self.per_container and cgroup is None:
            return sub == STATUS_PATH
        return sub in self._files and (cgroup is None or sub != STATUS_PATH)

    # ------------------------------------------------------------ callbacks

    def getattr(self, path: str, fh: Any = None) -> dict[str, Any]:
        self.calls["getattr"] += 1
        cgroup, sub = self._split(path)
        if self._is_dir(cgroup, sub):
            t = self._t
            return {"st_mode": DIR_MODE, "st_nlink": 2, "st_mtime": t, "st_ctime": t,
                    "st_atime": t}
        if not self._is_file(cgroup, sub):
            raise self._error(errno.ENOENT)
        if self.page_cache:
            gen = self._current(path, cgroup, sub)
            pusher = self.pusher
            if pusher is not None and not self._rendered_per_read(path):
                pusher.watch(path, gen.deadline)   # the kernel holds these attributes
            return {"st_mode": FILE_MODE, "st_nlink": 1, "st_size": len(gen.data),
                    "st_mtime": gen.mtime_ns, "st_ctime": gen.mtime_ns,
                    "st_atime": gen.mtime_ns}
        t = self._t
        mode = TRIGGER_MODE if self.triggers is not None and sub in PRESSURE_FILES \
            else FILE_MODE
        return {"st_mode": mode, "st_nlink": 1, "st_mtime": t, "st_ctime": t,
                "st_atime": t, "st_size": reported_size(self._sized_for(path, sub, cgroup,
                                                                        fh))}

    def _sized_for(self, path: str, sub: str, cgroup: str | None, fh: Any) -> bytes:
        """The rendering a direct_io file's size is reported from: an open handle's
        own (fstat: libfuse passes the handle), else one made now for the asking
        reader and kept for the open that follows (the open's permission check, a
        LOOKUP, or a stat)."""
        if fh is not None:
            data = self._per_handle.get(fh.fh)
            if data is None:  # sized before its first read: that read serves this
                data = self._render(sub, cgroup)[1]
                self._per_handle.put(fh.fh, data, unread=True)
            return data
        pid = self._fuse.fuse_get_context()[2]
        who = self._server.reader(pid)
        opened = self._opened_unread(who, path)
        if opened is not None:
            return opened
        try:
            _, data, key = self._server.render_for(sub, pid, cgroup, who)
        except UnseenReader:
            # Its read will be refused (counted and logged there); a stat still
            # answers, with one page, as for any file that fits in one.
            return b""
        self.calls["render"] += 1
        if cgroup is not None:
            key = cgroup
        elif key is None:
            key = self._server.view_key(pid, who)
        self._sized.remember(who, path, data, key)
        return data

    def _opened_unread(self, who: object, path: str) -> bytes | None:
        """The rendering of the reader's open handle of ``path`` that no read has served
        yet. The kernel sends an fstat's GETATTR without the handle (vfs_getattr passes no
        file), and open + fstat + read (Python's open(), cat) would otherwise render twice
        for each read, and report the size of a rendering never read; a /proc/stat or
        uptime read cost two. Kept for an open that may follow, as any GETATTR's is."""
        fh, key = self._sized.last_opened(who, path) or (None, None)
        data = self._per_handle.peek_unread(fh) if fh is not None else None
        if data is not None:
            self._sized.remember(who, path, data, key)
        return data

    def _current(self, path: str, cgroup: str | None, sub: str) -> Generation:
        """The generation to report for ``path``: rendered afresh once the last one
        is due (the server's caches make that cheap until the view expires)."""
        now = time.monotonic()
        gen = self.generations.get(path)
        if gen is not None and now < gen.deadline:
            return gen
        deadline, data = self._render(sub, cgroup)
        return self.generations.offer(path, deadline, data, now)[0]

    def readdir(self, path: str, fh: Any) -> list[Any]:
        self.calls["readdir"] += 1
        cgroup, sub = self._split(path)
        if not self._is_dir(cgroup, sub):
            raise self._error(errno.ENOTDIR if self._is_file(cgroup, sub)
                                   else errno.ENOENT)
        out: list[Any] = [(".", {"st_mode": DIR_MODE}, 0), ("..", {"st_mode": DIR_MODE}, 0)]
        if self.per_container and cgroup is None:
            # The containers served so far (any other key is served when looked up).
            names = [STATUS_PATH.lstrip("/"), *self._known]
            return out + [(n, {"st_mode": FILE_MODE if n == names[0] else DIR_MODE}, 0)
                          for n in names]
        base = sub.rstrip("/")
        for name in self._dirs[sub]:
            if cgroup is not None and f"{base}/{name}" == STATUS_PATH:
                continue
            mode = DIR_MODE if f"{base}/{name}" in self._dirs else FILE_MODE
            out.append((name, {"st_mode": mode}, 0))
        return out

    def open(self, path: str, fi: Any) -> int:
        self.calls["open"] += 1
        cgroup, sub = self._split(path)
        if not self._is_file(cgroup, sub):
            raise self._error(errno.EISDIR if self._is_dir(cgroup, sub)
                                   else errno.ENOENT)
        writing = fi.flags & os.O_ACCMODE != os.O_RDONLY
        if fi.flags & os.O_TRUNC or writing and (self.triggers is None
                                                  or sub not in PRESSURE_FILES):
            raise self._error(errno.EROFS)
        if self.page_cache:
            # The kernel remembers this for the whole connection (no_open) and from
            # then on opens, reads from its page cache and closes without asking us.
            raise self._error(errno.ENOSYS)
        # direct_io: every read() reaches us, whatever the size, and nothing stale is
        # served from the page cache (sendfile, splice and mmap still go through it:
        # reported_size says how they get one whole rendering).
        fi.direct_io = 1
        fi.fh = next(self._next)
        if writing:
            self._open_trigger(fi.fh, sub, cgroup)
        pid = self._fuse.fuse_get_context()[2]
        who = self._server.reader(pid)
        sized = self._sized.take(who, path)
        if sized is not None and (cgroup is not None
                                  or sized[1] == self._server.view_key(pid, who)):
            # The rendering this open's GETATTR reported the size of.
            self._per_handle.put(fi.fh, sized[0], unread=True)
            self._sized.opened(who, path, fi.fh, sized[1])
        return 0

    def read(self, path: str, size: int, offset: int, fi: Any) -> bytes:
        self.calls["read"] += 1
        cgroup, sub = self._split(path)
        if self.page_cache:
            # A page the kernel does not hold (yet): from the generation its GETATTR
            # reported, never a newer one (Generations says why).
            now = time.monotonic()
            gen = self.generations.read(path, now)
            if gen is None:   # evicted from our store, or read before any GETATTR
                gen = self._current(path, cgroup, sub)
                gen.last_read = now
            return gen.data[offset:offset + size]
        # A handle's first read, at any offset, serves the rendering its size was
        # reported from. After that a read at offset 0 renders afresh, so a reader
        # holding the file open and reading it again from the start (top, vmstat,
        # procps) sees new numbers; reads at other offsets come from the handle's
        # rendering, so no pass over the file is torn between two renderings.
        fh = fi.fh
        data = self._per_handle.take_unread(fh)
        if data is None:
            # A READ without a lock owner is the kernel filling pages (a fault of a
            # mapping, sendfile, splice), not a read() of the process: it gets the
            # handle's rendering, so a page dropped and faulted in again under a
            # mapping comes back with the same bytes.
            fresh = offset == 0 and getattr(fi, "lock_owner", 1) != 0
            data = None if fresh else self._per_handle.get(fh)
            if data is None:
                data = self._render(sub, cgroup)[1]
                self._per_handle.put(fh, data)
        return data[offset:offset + size]

    def statfs(self, path: str) -> dict[str, int]:
        return {"f_bsize": 4096, "f_frsize": 4096, "f_namemax": 255}

    def access(self, path: str, amode: int) -> int:
        cgroup, sub = self._split(path)
        if not self._is_dir(cgroup, sub) and not self._is_file(cgroup, sub):
            raise self._error(errno.ENOENT)
        if amode & os.W_OK:
            raise self._error(errno.EROFS)
        return 0

    # Read-only filesystem: everything that would change it.
    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise self._error(errno.EROFS)

    write = create = mkdir = rmdir = unlink = rename = link = symlink = mknod = _refuse
    chmod = chown = truncate = utimens = setxattr = removexattr = _refuse

    # Left out of the FUSE callback table (the bindings skip None): without a flush
    # handler the kernel learns ENOSYS once and stops sending FLUSH on every close,
    # which saves a full round trip per open/read/close.
    # No release either (see renderings.OpenRenderings).
    flush = fsync = fsyncdir = opendir = releasedir = getxattr = listxattr = None
    readlink = lock = bmap = ioctl = release = None

