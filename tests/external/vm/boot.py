"""Boot the cgroup v2 test VM once and run one command in it (host side).

qemu with software emulation (KVM here is PVM-only and cannot boot a stock kernel), the
host root shared read-only over 9p as the guest's root, a writable share for results.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class VmRun:
    returncode: int | None      # the guest command's status, None if it never finished
    console: str
    seconds: float


def prepare() -> tuple[str, str]:
    out = subprocess.run(["bash", str(HERE / "prepare.sh")], check=True, capture_output=True,
                         text=True, timeout=900)
    kernel, initrd = out.stdout.split()[-2:]
    return kernel, initrd


def run_in_vm(cmd: str, results: Path, smp: int = 4, mem_mib: int = 1024,
              timeout: float = 900) -> VmRun:
    if shutil.which("qemu-system-x86_64") is None:
        raise RuntimeError("qemu-system-x86_64 is missing: .ci/setup installs qemu-system-x86")
    kernel, initrd = prepare()
    results.mkdir(parents=True, exist_ok=True)
    encoded = base64.b64encode(cmd.encode()).decode()
    append = f"console=ttyS0 quiet panic=-1 guestcmd={encoded}"
    argv = ["qemu-system-x86_64", "-accel", "tcg", "-cpu", "max", "-smp", str(smp),
            "-m", str(mem_mib), "-nodefaults", "-no-user-config", "-display", "none",
            "-serial", "stdio", "-no-reboot", "-kernel", kernel, "-initrd", initrd,
            "-append", append,
            "-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,"
                       "multidevs=remap",
            "-virtfs", f"local,path={results},mount_tag=results,security_model=none"]
    t0 = time.monotonic()
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                             stdin=subprocess.DEVNULL)
        console = out.stdout + out.stderr
    except subprocess.TimeoutExpired as e:
        console = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) \
            else (e.stdout or "")
        return VmRun(None, console + "\n[timeout]", time.monotonic() - t0)
    rc = None
    for line in console.splitlines():
        if line.startswith("GUEST: done rc="):
            rc = int(line.split("=", 1)[1])
    return VmRun(rc, console, time.monotonic() - t0)


if __name__ == "__main__":
    import sys

    r = run_in_vm(sys.argv[1], Path(sys.argv[2] if len(sys.argv) > 2 else "/tmp/guestfs-vm"))
    print(r.console)
    print(f"rc={r.returncode} in {r.seconds:.1f}s")
    os._exit(0 if r.returncode == 0 else 1)
