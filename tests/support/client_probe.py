"""Run the clients people watch a container with, one after another, and print one JSON
object of what each of them showed. Run inside the environment under test (a `guestfs run`,
a mount namespace with LXCFS's files bound over /proc, or the bare cgroup): it reads only
the system's own /proc and /sys paths, as the clients do.

Standalone on purpose (no imports from tests/): it runs with the venv's interpreter inside
another mount namespace. Each reading is the client's own output parsed the way a person
reads it; nothing is computed from the files directly except where the client is a library
(Node's os, psutil) whose numbers are the API a program uses.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def sh(cmd: str, timeout: float = 30) -> str:
    env = dict(os.environ, LC_ALL="C")
    return subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, env=env,
                          timeout=timeout, check=True).stdout


def vmstat() -> dict[str, object]:
    lines = [ln.split() for ln in sh("vmstat 1 2").splitlines() if ln.strip()]
    header = next(ln for ln in lines if "id" in ln and "us" in ln)
    row = dict(zip(header, map(int, lines[-1]), strict=True))
    return {"idle": row["id"], "busy": row["us"] + row["sy"]}


def top() -> dict[str, object]:
    out = sh("top -bn2 -d1")
    line = [ln for ln in out.splitlines() if ln.startswith("%Cpu(s)")][-1]
    parts = line.split(":", 1)[1].replace(",", " ").split()
    values = {parts[i + 1]: float(parts[i]) for i in range(0, len(parts) - 1, 2)}
    load = re.search(r"load average: ([\d.]+)", out)
    mem = re.search(r"MiB Mem :\s+([\d.]+) total", out)
    return {"idle": values["id"], "load1": float(load.group(1)) if load else -1,
            "mem_total_mib": float(mem.group(1)) if mem else -1}


def mpstat() -> dict[str, object]:
    average = next(ln.split() for ln in sh("mpstat 1 1").splitlines()
                   if ln.startswith("Average:"))
    return {"idle": float(average[-1])}


def uptime_cmd() -> dict[str, object]:
    out = sh("uptime")
    load = re.search(r"load average: ([\d.]+)", out)
    return {"load1": float(load.group(1)) if load else -1}


def _htop_seconds(text: str) -> float:
    m = re.search(r"Uptime: (?:(\d+) days?, )?(\d+):(\d+):(\d+)", text)
    if m is None:
        return -1
    days, h, mi, s = (int(g or 0) for g in m.groups())
    return ((days * 24 + h) * 60 + mi) * 60 + s


def _mib(value: str) -> float:
    units = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
    return float(value[:-1]) * units[value[-1]]


def htop() -> dict[str, object]:
    """htop on a real terminal (tmux), its screen read after three one-second refreshes:
    the CPU meters then show the last second, as a person sees them."""
    sock = f"guestfs-probe-{os.getpid()}"
    home = tempfile.mkdtemp(prefix="guestfs-htop-")
    env = f"HOME={home} XDG_CONFIG_HOME={home} TERM=xterm"
    # tmux's socket directory, where /tmp may be missing or read-only (the test VM).
    os.environ["TMUX_TMPDIR"] = home
    try:
        sh(f"tmux -L {sock} new-session -d -x 200 -y 50 '{env} htop -d 10'")
        time.sleep(2)
        TRUE.begin()         # the meters on the screen show the last refresh interval
        time.sleep(1.5)
        true = TRUE.share()
        screen = sh(f"tmux -L {sock} capture-pane -p")
    finally:
        subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True)
        shutil.rmtree(home, ignore_errors=True)
    cpus = [float(p) for p in re.findall(r"^\s*\d+\[.*?([\d.]+)%\]", screen, re.M)]
    load = re.search(r"Load average: ([\d.]+)", screen)
    mem = re.search(r"Mem\[[^\]]*?([\d.]+[KMGT])/([\d.]+[KMGT])\]", screen)
    return {"cpus": len(cpus), "busy": sum(cpus) / len(cpus) if cpus else -1,
            "load1": float(load.group(1)) if load else -1,
            "uptime": _htop_seconds(screen),
            "mem_total_mib": _mib(mem.group(2)) if mem else -1, "screen": screen,
            "true_busy": true}


NODE = r"""
const os = require('os');
const sum = (c) => Object.values(c.times).reduce((a, b) => a + b, 0);
const a = os.cpus();
setTimeout(() => {
  const b = os.cpus();
  let idle = 0, total = 0;
  b.forEach((c, i) => { idle += c.times.idle - a[i].times.idle; total += sum(c) - sum(a[i]); });
  console.log(JSON.stringify({cpus: b.length, totalmem: os.totalmem(), uptime: os.uptime(),
    load1: os.loadavg()[0], idle: total > 0 ? 100 * idle / total : -1,
    parallelism: os.availableParallelism ? os.availableParallelism() : -1}));
}, 1000);
"""


def node() -> dict[str, object]:
    out = subprocess.run(["node", "-e", NODE], capture_output=True, text=True, timeout=30,
                         check=True).stdout
    return json.loads(out)


def psutil_view() -> dict[str, object]:
    import psutil

    busy = psutil.cpu_percent(interval=1)
    return {"busy": busy, "count": psutil.cpu_count(),
            "total": psutil.virtual_memory().total, "load1": psutil.getloadavg()[0]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    metrics = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            metrics[name] = float(value)
    return metrics


def node_exporter() -> dict[str, object]:
    """prometheus-node-exporter with its default collectors, on 127.0.0.1 only, scraped
    twice two seconds apart: the idle share is rate(node_cpu_seconds_total{mode="idle"})
    over the CPUs, as a dashboard computes it."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    proc = subprocess.Popen(["prometheus-node-exporter",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                first, t1 = _scrape(url), time.monotonic()
                TRUE.begin()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.1)
        time.sleep(2)
        second, t2 = _scrape(url), time.monotonic()
        true = TRUE.share()
    finally:
        proc.terminate()
        proc.wait(10)
    idle_keys = [k for k in second if k.startswith("node_cpu_seconds_total{")
                 and 'mode="idle"' in k]
    idle = sum(second[k] - first.get(k, 0) for k in idle_keys)
    collectors = {re.search(r'collector="([^"]+)"', k).group(1): v  # type: ignore[union-attr]
                  for k, v in second.items() if k.startswith("node_scrape_collector_success")}
    return {"cpus": len(idle_keys),
            "idle": 100 * idle / ((t2 - t1) * len(idle_keys)) if idle_keys else -1,
            "mem_total": second.get("node_memory_MemTotal_bytes", -1),
            "load1": second.get("node_load1", -1), "collectors": collectors,
            "true_busy": true}


def proc_files() -> dict[str, object]:
    with open("/proc/uptime") as f:
        age = float(f.read().split()[0])
    with open("/proc/loadavg") as f:
        load1 = float(f.read().split()[0])
    return {"uptime": age, "load1": load1}


class TrueShare:
    """The container's real busy share (its cgroup's CPU counter over wall time and the
    view's N CPUs) while a client measures: on a shared machine the busy loop gets less
    than a whole CPU when others run, and a client is right when it matches this."""

    def __init__(self) -> None:
        self.path = os.environ.get("GUESTFS_PROBE_USAGE")
        self.cpus = int(os.environ.get("GUESTFS_PROBE_CPUS", "1"))
        self.start: tuple[float, float] | None = None

    def _read(self) -> tuple[float, float]:
        assert self.path is not None
        with open(self.path) as f:
            text = f.read()
        if self.path.endswith("cpu.stat"):       # v2: usage_usec
            usec = dict(ln.split() for ln in text.splitlines())["usage_usec"]
            return time.monotonic(), int(usec) / 1e6
        return time.monotonic(), int(text) / 1e9  # v1 cpuacct.usage: ns

    def begin(self) -> None:
        self.start = self._read() if self.path else None

    def share(self) -> float | None:
        if self.start is None:
            return None
        t1, u1 = self._read()
        t0, u0 = self.start
        return 100 * (u1 - u0) / ((t1 - t0) * self.cpus)


TRUE = TrueShare()


CLIENTS = {"vmstat": vmstat, "top": top, "mpstat": mpstat, "uptime": uptime_cmd,
           "htop": htop, "node": node, "psutil": psutil_view,
           "node_exporter": node_exporter, "proc": proc_files}


def main(names: list[str]) -> None:
    result: dict[str, object] = {}
    for name in names or list(CLIENTS):
        try:
            TRUE.begin()
            reading = CLIENTS[name]()
            reading.setdefault("true_busy", TRUE.share())
            result[name] = reading
        except Exception as e:  # noqa: BLE001 - a failing client is a finding, reported
            result[name] = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
