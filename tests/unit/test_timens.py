"""A reader in a time namespace (the app under `guestfs run`) gets /proc/stat's btime as
its kernel would show it: moved later by its boottime offset, so ps's STARTED (btime +
start time) stays wall time while its ELAPSED (uptime − start time) uses the container's
boot clock."""

from __future__ import annotations

from guestfs.render.stat import shift_btime
from guestfs.sources.timens import parse_boottime_offset
from tests.unit.test_server import server


def btime(text: bytes) -> int:
    return int(next(ln for ln in text.split(b"\n") if ln.startswith(b"btime ")).split()[1])


def test_parse_boottime_offset_reads_the_kernels_format():
    assert parse_boottime_offset("monotonic           0         0\n"
                                 "boottime       -19477 250000000\n") == -19476.75
    assert parse_boottime_offset("monotonic 0 0\n") == 0.0
    assert parse_boottime_offset("") == 0.0


def test_shift_btime_moves_only_the_btime_line():
    text = "cpu  1 2 3\nintr 5\nbtime 1764490000\nprocesses 9\n"
    assert shift_btime(text, -1000.0) == "cpu  1 2 3\nintr 5\nbtime 1764491000\nprocesses 9\n"
    assert shift_btime(text, 0.0) == text


def test_a_reader_in_a_time_namespace_gets_its_btime(copy_fixture):
    root = copy_fixture("k8s-systemd-v2-burstable")
    srv, _ = server(root, cache_ttl=60)
    host_btime = 1764490000        # the fixture's /proc/stat
    assert btime(srv.render("/proc/stat", 7)) == host_btime
    # pid 8 shares pid 7's cgroup view but lives in a time namespace booted 5000 s later.
    (root / "proc/8/timens_offsets").write_text("monotonic 0 0\nboottime -5000 0\n")
    (root / "proc/8/cgroup").write_text((root / "proc/7/cgroup").read_text())
    assert btime(srv.render("/proc/stat", 8)) == host_btime + 5000
    assert btime(srv.render("/proc/stat", 7)) == host_btime   # not cached across readers
