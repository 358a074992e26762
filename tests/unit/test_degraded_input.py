"""Bad or missing cgroup data degrades the container's view; it never becomes the host's."""

from __future__ import annotations

import re
import subprocess
import sys

from guestfs.daemon.server import ServerConfig, ViewServer
from guestfs.engine.explicit import ExplicitLimits
from guestfs.sources.host_root import HostRoot
from tests.support.render_helpers import meminfo_kb, render_all

V1_MEM = "/sys/fs/cgroup/memory"
POD = ("/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/"
       "kubepods-burstable-poda5d4fbc7_30d6_43e8_8425_8ee6f401decc.slice")


def put(root, path: str, text: str) -> None:
    (root / path.lstrip("/")).write_text(text)


def test_negative_hierarchical_limit_keeps_the_level_limit(copy_fixture):
    root = copy_fixture("docker-v1")
    stat = (root / V1_MEM.lstrip("/") / "memory.stat").read_text()
    put(root, f"{V1_MEM}/memory.stat",
        stat.replace("hierarchical_memory_limit 536870912", "hierarchical_memory_limit -4096"))
    got = meminfo_kb(render_all(root)["/proc/meminfo"])
    assert got["MemTotal"] == 512 * 1024      # memory.limit_in_bytes still says 512 MiB


def test_empty_memory_stat_gives_zeros_not_the_hosts_cache(copy_fixture):
    root = copy_fixture("docker-v1")
    put(root, f"{V1_MEM}/memory.stat", "")
    got = meminfo_kb(render_all(root)["/proc/meminfo"])
    assert got["MemTotal"] == 512 * 1024
    # The fixture host's Cached is 4704368 kB, far above the container's total.
    assert got["Cached"] == 0 and got["Active(file)"] == 0 and got["Inactive"] == 0


def test_negative_counters_are_never_served(copy_fixture):
    root = copy_fixture("k8s-systemd-v2-burstable")
    stat = (root / POD.lstrip("/") / "memory.stat").read_text()
    stat = re.sub(r"^(file|inactive_file|active_file|anon) \d+$", r"\1 -18446744073",
                  stat, flags=re.M)
    put(root, f"{POD}/memory.stat", stat)
    put(root, f"{POD}/cpu.stat", "usage_usec -5\nuser_usec -3\nsystem_usec -2\n")
    files = render_all(root, "7")
    got = meminfo_kb(files["/proc/meminfo"])
    assert all(v >= 0 for v in got.values())
    assert 0 <= got["MemFree"] <= got["MemAvailable"] <= got["MemTotal"] == 512 * 1024
    # cpu.stat unusable: /proc/stat keeps the view's 1 CPU, busy held at 0.
    cpu = [ln.split() for ln in files["/proc/stat"].splitlines() if ln.startswith("cpu")]
    assert [c[0] for c in cpu] == ["cpu", "cpu0"]
    assert all(int(x) >= 0 for c in cpu for x in c[1:])


def test_missing_cpu_stat_keeps_the_cpu_count_in_every_file(copy_fixture):
    root = copy_fixture("k8s-systemd-v2-burstable")
    for d in root.joinpath("sys/fs/cgroup").rglob("cpu.stat"):
        d.unlink()
    files = render_all(root, "7")
    n_stat = sum(1 for ln in files["/proc/stat"].splitlines() if re.match(r"cpu\d", ln))
    n_info = files["/proc/cpuinfo"].count("processor\t:")
    assert n_stat == n_info == 1 and files["/sys/devices/system/cpu/online"] == "0\n"
    age, idle = (float(x) for x in files["/proc/uptime"].split())
    assert age == 512.43 and idle == 512.43   # nothing known busy: all idle, 1 CPU


def test_a_failing_render_serves_the_last_good_one_not_the_hosts(copy_fixture):
    root = copy_fixture("k8s-systemd-v2-burstable")
    srv = ViewServer(HostRoot(str(root)), ServerConfig(cache_ttl=0, explicit=ExplicitLimits()))
    good = srv.render("/proc/uptime", 7)
    assert good.startswith(b"512.43 ")
    put(root, "/proc/uptime", "garbage\n")          # the host file itself goes bad
    assert srv.render("/proc/uptime", 7) == good
    assert srv.errors == 1 and sum(srv.fallbacks.values()) == 1
    good = srv.render("/proc/meminfo", 7)
    put(root, f"{POD}/memory.max", "0\n")           # now the kubepods.slice 7.3 GiB binds
    put(root, "/proc/self/mountinfo", "\x00garbage")  # and the mount table is unreadable
    got = meminfo_kb(srv.render("/proc/meminfo", 7).decode())
    assert got["MemTotal"] != 8131768                # never the host's RAM
    assert got["MemTotal"] > 0


def test_show_reports_a_malformed_host_file_in_one_line(copy_fixture, capsys):
    from guestfs.cli.main import main

    root = copy_fixture("k8s-systemd-v2-burstable")
    put(root, "/proc/uptime", "")
    rc = main(["show", "/proc/uptime", "--root", str(root), "--pid", "7"])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and len(err.splitlines()) == 1 and "/proc/uptime" in err, err


def test_explain_mount_of_a_plain_directory_is_a_one_line_error(tmp_path):
    out = subprocess.run([sys.executable, "-m", "guestfs", "explain", "--mount",
                          str(tmp_path)], capture_output=True, text=True)
    assert out.returncode != 0
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert "--mount" in out.stderr, out.stderr
