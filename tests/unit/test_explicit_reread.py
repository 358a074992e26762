"""An in-place resize seen through the downward API: kubelet rewrites a downwardAPI volume's
files (its atomic writer swaps the ``..data`` symlink) and the daemon, which re-reads the
limits directory at most once per TTL, serves the new limit. Env vars never change after
start, so they cannot carry a resize."""

from __future__ import annotations

import os
import time
from pathlib import Path

from guestfs.daemon.server import ServerConfig, ViewServer
from guestfs.engine.explicit import ExplicitSettings, collect_explicit
from guestfs.sources.host_root import HostRoot
from tests.conftest import fixture_root
from tests.support.render_helpers import meminfo_kb

TTL = 0.05


def atomic_write(volume: Path, files: dict[str, str], generation: int) -> None:
    """Lay out ``files`` as kubelet's atomic writer does: a timestamped directory, the
    ``..data`` symlink renamed over to it, and each file a symlink into ``..data``."""
    ts = volume / f"..2026_12_01_00_00_{generation:02d}.000000001"
    ts.mkdir()
    for name, text in files.items():
        (ts / name).write_text(text)
    tmp = volume / "..data_tmp"
    tmp.symlink_to(ts.name)
    os.replace(tmp, volume / "..data")
    for name in files:
        if not (volume / name).is_symlink():
            (volume / name).symlink_to(f"..data/{name}")


def serve_with_volume(volume: Path) -> ViewServer:
    settings = ExplicitSettings(limits_dir=str(volume), env={})
    config = ServerConfig(view="caller", cache_ttl=TTL, explicit=collect_explicit(settings),
                          reread_explicit=lambda: collect_explicit(settings))
    return ViewServer(HostRoot(str(fixture_root("k8s-systemd-v2-besteffort"))), config)


def mem_total(srv: ViewServer) -> int:
    return meminfo_kb(srv.render("/proc/meminfo", 7).decode())["MemTotal"]


def test_a_resized_limit_in_the_downward_api_volume_shows_within_the_ttl(tmp_path):
    # A best-effort pod: its cgroups say max, so the volume's limit is the one that counts.
    atomic_write(tmp_path, {"limits.memory": "536870912\n", "limits.cpu": "1\n"}, 1)
    srv = serve_with_volume(tmp_path)
    assert mem_total(srv) == 524288
    atomic_write(tmp_path, {"limits.memory": "805306368\n", "limits.cpu": "2\n"}, 2)
    time.sleep(3 * TTL)
    assert mem_total(srv) == 786432
    cpus = srv.render("/sys/devices/system/cpu/online", 7).decode().strip()
    assert cpus == "0-1"
    assert srv.errors == 0


def test_a_volume_file_gone_bad_keeps_the_last_good_limits_counted(tmp_path):
    atomic_write(tmp_path, {"limits.memory": "536870912\n"}, 1)
    srv = serve_with_volume(tmp_path)
    assert mem_total(srv) == 524288
    atomic_write(tmp_path, {"limits.memory": "lots\n"}, 2)
    time.sleep(3 * TTL)
    assert mem_total(srv) == 524288
    assert srv.errors == 1
    [cause] = srv.fallbacks
    assert "explicit limits unreadable" in cause and "limits.memory" in cause


def test_without_a_limits_directory_the_start_values_hold():
    settings = ExplicitSettings(memory_limit="512Mi", env={})
    srv = ViewServer(HostRoot(str(fixture_root("k8s-systemd-v2-besteffort"))),
                     ServerConfig(cache_ttl=TTL, explicit=collect_explicit(settings)))
    assert mem_total(srv) == 524288
