"""Serve a TinyFs (tests/support/fuseframes.py) at MOUNTPOINT through guestfs's own FUSE
engine, used directly (mountfd + Session), for tests/host/test_fuse_engine.py:

    python engine_serve.py MOUNTPOINT [--page-cache]

Mounts by mount(2) with CAP_SYS_ADMIN, else through fusermount3. Prints one JSON line
once INIT is done (how it mounted and what was negotiated). SIGUSR1 changes /a and tells
the kernel (FUSE_NOTIFY_INVAL_INODE), printing the errno the kernel answered; SIGUSR2
changes it without telling; SIGTERM
unmounts and exits 0. With --page-cache, open answers ENOSYS (no_open) and attributes
and entries are kept an hour, so only the notification can make the kernel see /a anew.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading

from guestfs.fuse import inodes, mountfd
from guestfs.fuse.adapter import run_session
from guestfs.fuse.session import Options, Session
from tests.support.fuseframes import TinyFs


def main() -> int:
    mp = sys.argv[1]
    cached = "--page-cache" in sys.argv
    fs = TinyFs(no_open=cached, attr_timeout=3600.0 if cached else 0.0,
                entry_timeout=3600.0 if cached else 0.5)
    m = mountfd.mount(mountfd.MountSpec(mp, fsname="guestfs-test", subtype="guestfs-test"))
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    session = Session(os.dup(m.fd), fs, Options(threads=2), wake_fd=wake_w)

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
        print(json.dumps({"via": m.via, "negotiated": session.negotiated.to_json()}),
              flush=True)

    threading.Thread(target=report, daemon=True).start()
    try:
        run_session(session, wake_r)
    finally:
        mountfd.unmount(m)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
