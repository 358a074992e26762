"""attach's work done in a forked child: setns(2) needs a single-threaded process, and a
FUSE request to a stopped daemon must not hang the caller, so the child is killed after a
timeout. Shared by `guestfs attach` and the OCI hook."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import time
from collections.abc import Callable
from typing import Any

from guestfs.system.oneline import os_error_line

CHILD_TIMEOUT = 10.0      # a stopped daemon blocks every request to it; never wait forever


class AttachError(OSError):
    """A one-line reason attach refused or failed, for the CLI and the watch log."""


def run_in_child(body: Callable[[], dict[str, Any]],
                 timeout: float = CHILD_TIMEOUT) -> dict[str, Any]:
    """``body()`` in a forked, single-threaded child (setns needs one; a FUSE request to a
    stopped daemon must not hang us): its dict result, or AttachError with its one-line
    failure, or after ``timeout`` seconds."""
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(r)
        _run_child(w, body)
    os.close(w)
    try:
        raw = _read_child(r, child, timeout)
    finally:
        os.close(r)
    os.waitpid(child, 0)
    try:
        out = json.loads(raw.decode() or "{}")
    except ValueError:
        out = {}
    if "ok" not in out:
        raise AttachError(out.get("error", "failed"))
    return out["ok"]


def _run_child(w: int, body: Callable[[], dict[str, Any]]) -> None:
    try:
        out = {"ok": body()}
        code = 0
    except BaseException as e:  # noqa: BLE001 - report any failure to the parent
        msg = str(e) if isinstance(e, AttachError) else os_error_line(e) \
            if isinstance(e, OSError) else f"{type(e).__name__}: {e}"
        out, code = {"error": msg}, 1
    with contextlib.suppress(OSError):
        os.write(w, json.dumps(out).encode())
    os._exit(code)


def _read_child(r: int, child: int, timeout: float) -> bytes:
    chunks, deadline = [], time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([r], [], [], left)[0]:
            # Blocked in a FUSE request to a stopped daemon: SIGKILL ends the wait.
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            raise AttachError(f"timed out after {timeout:g} s "
                              "(a FUSE request got no answer: is the daemon stopped?)")
        data = os.read(r, 65536)
        if not data:
            return b"".join(chunks)
        chunks.append(data)
