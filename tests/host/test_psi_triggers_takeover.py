"""PSI triggers through the deaths of a held mount's daemon: a reader's trigger file, open
and polled all along, keeps its trigger when the serving daemon is killed (-9) and when a
DaemonSet daemon is stopped for a rolling update (SIGTERM, then a new daemon): the
successor adopts it from the holder (psi_triggers.Triggers.adopt), its events reach the
same poll as the kernel's own /proc/pressure/cpu trigger's do, and the poll never sees
the POLLERR of a lost trigger. This host is cgroup v1, so the triggers are the host's
/proc/pressure ones (test_psi_triggers.py says why)."""

from __future__ import annotations

import os
import select
import signal
import time
from pathlib import Path

import pytest

from tests.host.test_faults_takeover import held_mount, standalone  # noqa: F401 - fixtures
from tests.host.test_psi_triggers import KERNEL_CPU, TRIGGER, cpu_hogs, open_trigger, status
from tests.support.fusemount import is_guestfs_mount
from tests.support.heldmount import HeldMount
from tests.support.mounts import wait_for
from tests.support.procs import alive

pytestmark = pytest.mark.real


def _served(m: HeldMount) -> None:
    assert wait_for(lambda: is_guestfs_mount(m.mp) and m.serving_pid() is not None), \
        Path(m.log).read_text()[-3000:]


def _succeeded(m: HeldMount, victim: int, sig: int, start_one: bool) -> None:
    os.kill(victim, sig)
    assert wait_for(lambda: not alive(victim), 15)
    if start_one:
        m.start()
    assert wait_for(lambda: m.serving_pid() not in (None, victim), 15), \
        Path(m.log).read_text()[-3000:]


def _events(served: int, kernel: int, seconds: float,
            deaths: list[tuple[float, int, bool]], m: HeldMount) -> dict[int, int]:
    """Both files polled for ``seconds`` under CPU hogs; at each (moment, signal,
    start_one) of ``deaths`` the serving daemon is ended so. Every event must be a
    POLLPRI alone."""
    p = select.poll()
    p.register(served, select.POLLPRI)
    p.register(kernel, select.POLLPRI)
    counts = {served: 0, kernel: 0}
    began = time.monotonic()
    pending = sorted(deaths)
    with cpu_hogs():
        while (left := began + seconds - time.monotonic()) > 0:
            if pending and time.monotonic() - began >= pending[0][0]:
                _, sig, start_one = pending.pop(0)
                victim = m.serving_pid()
                assert victim is not None
                _succeeded(m, victim, sig, start_one)
                continue
            wait = left if not pending else max(0.0, pending[0][0] - (time.monotonic()
                                                                      - began))
            for fd, ev in p.poll(min(left, wait) * 1000):
                assert ev == select.POLLPRI, hex(ev)    # no POLLERR: the trigger lives
                counts[fd] += 1
    return counts


def _release_seen(m: HeldMount, before: int) -> bool:
    return wait_for(lambda: status(m.mp)["psi_triggers"]["released"] > before, 5)


def test_a_trigger_outlives_killed_daemons(held_mount: HeldMount) -> None:  # noqa: F811
    m = held_mount
    m.start()
    _served(m)
    served, kernel = open_trigger(f"{m.mp}/proc/pressure/cpu"), open_trigger(KERNEL_CPU)
    try:
        assert os.write(served, TRIGGER) == len(TRIGGER)
        assert os.write(kernel, TRIGGER) == len(TRIGGER)
        first = m.serving_pid()
        assert first is not None
        _succeeded(m, first, signal.SIGKILL, start_one=False)     # the holder's own
        assert status(m.mp)["psi_triggers"]["adopted"] == 1
        # One more death while the events come, succeeded by a new mount at once.
        counts = _events(served, kernel, 9.0, [(3.0, signal.SIGKILL, True)], m)
        print(f"events in 9 s across 2 kill -9s: served {counts[served]}, kernel "
              f"{counts[kernel]}; {status(m.mp)['psi_triggers']}")
        assert counts[served] >= 2 and abs(counts[served] - counts[kernel]) <= 1, counts
        st = status(m.mp)["psi_triggers"]
        assert st["adopted"] == 1 and st["untold"] == 0, st
    finally:
        os.close(kernel)
        released = status(m.mp)["psi_triggers"]["released"]
        os.close(served)
    # The adopted trigger is the successor's to release: its RELEASE reaches it.
    assert _release_seen(m, released)


def test_a_rolling_update_keeps_the_trigger_with_the_standalone_holder(
        held_mount: HeldMount, standalone) -> None:  # noqa: F811
    """SIGTERM to the daemon (it closes its descriptors as it stops), the standalone
    holder keeps the trigger, the new daemon adopts it."""
    m = held_mount
    m.start()
    _served(m)
    served, kernel = open_trigger(f"{m.mp}/proc/pressure/cpu"), open_trigger(KERNEL_CPU)
    try:
        os.write(served, TRIGGER)
        os.write(kernel, TRIGGER)
        counts = _events(served, kernel, 8.0, [(2.0, signal.SIGTERM, True)], m)
        print(f"events in 8 s across a rolling update: served {counts[served]}, kernel "
              f"{counts[kernel]}")
        assert counts[served] >= 2 and abs(counts[served] - counts[kernel]) <= 1, counts
        assert status(m.mp)["psi_triggers"]["adopted"] == 1
    finally:
        os.close(kernel)
        os.close(served)
