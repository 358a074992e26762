"""Serve a TinyFs (tests/support/fuseframes.py) at MOUNTPOINT through guestfs's own FUSE
engine, used directly (mountfd + Session), for tests/host/test_fuse_engine.py:

    python engine_serve.py MOUNTPOINT [--page-cache] [--fd N [--stall | --negotiated JSON]]

Mounts by mount(2) with CAP_SYS_ADMIN, else through fusermount3; with ``--fd N`` serves
the connection N the caller mounted instead. Prints one JSON line once it serves (how it
mounted, what was negotiated). ``--stall``: reads of /slow are never answered (a server
killed in the middle of a request). ``--negotiated JSON``: a successor on an initialised
connection (no INIT comes): it adopts the files' node ids and asks the kernel to send
again what its predecessor left unanswered (FUSE_NOTIFY_RESEND). SIGUSR1 changes /a and
tells the kernel (FUSE_NOTIFY_INVAL_INODE), printing the errno the kernel answered;
SIGUSR2 changes it without telling; SIGTERM unmounts (what it mounted) and exits 0.
With --page-cache, open answers ENOSYS (no_open) and attributes and entries are kept an
hour, so only the notification can make the kernel see /a anew.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading

from guestfs.fuse import inodes, mountfd
from guestfs.fuse.adapter import run_session
from guestfs.fuse.session import Negotiated, Options, Session
from tests.support.fuseframes import TinyFs


def _value(flag: str) -> str | None:
    return sys.argv[sys.argv.index(flag) + 1] if flag in sys.argv else None


class StallingFs(TinyFs):
    def read(self, path: str, fh: int, offset: int, size: int, lock_owner: int,
             flags: int) -> bytes:
        if path == "/slow":
            threading.Event().wait()
        return super().read(path, fh, offset, size, lock_owner, flags)


def main() -> int:
    mp = sys.argv[1]
    cached = "--page-cache" in sys.argv
    given, agreed = _value("--fd"), _value("--negotiated")
    fs = (StallingFs if "--stall" in sys.argv else TinyFs)(
        no_open=cached, attr_timeout=3600.0 if cached else 0.0,
        entry_timeout=3600.0 if cached else 0.5)
    if given is not None:
        fs.files["/slow"] = b"answered by the successor\n"
        fd, m = int(given), None
    else:
        m = mountfd.mount(mountfd.MountSpec(mp, fsname="guestfs-test", subtype="guestfs-test"))
        fd = m.fd
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    neg = Negotiated.from_json(agreed) if agreed else None
    session = Session(os.dup(fd), fs, Options(threads=2), negotiated=neg, wake_fd=wake_w)
    hello: dict[str, object] = {"via": m.via if m else "fd"}
    if neg is not None:
        hello["adopted"] = session.inodes.adopt([*fs.files, *fs._dirs()])
        hello["resend"] = session.notify_resend()

    def change(_sig: int, _frame: object) -> None:
        fs.files["/a"] = b"changed, and longer\n"
        err = session.notify_inval_inode(inodes.path_id("/a"))
        print(json.dumps({"notified": err}), flush=True)

    def change_quietly(_sig: int, _frame: object) -> None:
        fs.files["/a"] = b"changed, and longer\n"
        print(json.dumps({"notified": None}), flush=True)

    signal.signal(signal.SIGUSR1, change)
    signal.signal(signal.SIGUSR2, change_quietly)

    def report() -> None:
        session.initialised.wait()
        print(json.dumps({**hello, "negotiated": session.negotiated.to_json()}), flush=True)

    threading.Thread(target=report, daemon=True).start()
    try:
        run_session(session, wake_r)
    finally:
        if m is not None:
            mountfd.unmount(m)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
