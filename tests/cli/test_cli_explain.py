from __future__ import annotations

import json

import pytest

from guestfs.cli.main import main
from tests.conftest import FIXTURE_NAMES, fixture_root

TOP_KEYS = {"schema", "pid", "cgroup_versions", "host", "memory", "swap", "cpu", "warnings"}


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_json_has_the_documented_keys_on_every_fixture(capsys, name):
    rc, out, _ = run(capsys, "explain", "--json", "--root", str(fixture_root(name)))
    assert rc == 0
    got = json.loads(out)
    assert set(got) == TOP_KEYS and got["schema"] == 1
    assert set(got["memory"]) == {"limit_bytes", "limited", "source", "considered", "usage",
                                  "leaf_usage"}
    assert set(got["swap"]) == {"limit_bytes", "limited", "source", "considered",
                                "usage_bytes", "usage_source"}
    assert set(got["cpu"]) == {"count", "limited", "source", "rounding", "visible_cpus",
                               "quota", "quota_source", "quota_considered", "cpuset",
                               "cpuset_source"}
    assert set(got["memory"]["source"]) == {"kind", "file", "cgroup", "note"}


def test_text_names_the_file_and_level(capsys):
    root = fixture_root("k8s-systemd-v2-burstable")
    rc, out, _ = run(capsys, "explain", "--root", str(root))
    assert rc == 0
    line = next(ln for ln in out.splitlines() if ln.startswith("memory limit"))
    assert "512.0 MiB" in line
    assert "kubepods-burstable-poda5d4fbc7_30d6_43e8_8425_8ee6f401decc.slice/memory.max" in line
    assert "every source considered" in out
    cpu = next(ln for ln in out.splitlines() if ln.startswith("cpu count"))
    assert "1 (ceil)" in cpu and "cpu.max" in cpu


def test_env_and_rounding_options(capsys, monkeypatch):
    root = str(fixture_root("minikube-nested-v2"))
    rc, out, _ = run(capsys, "explain", "--json", "--root", root, "--cpu-rounding", "floor")
    assert json.loads(out)["cpu"]["count"] == 1
    monkeypatch.setenv("GUESTFS_CPU_ROUNDING", "floor")
    rc, out, _ = run(capsys, "explain", "--json", "--root", root)
    assert json.loads(out)["cpu"]["count"] == 1
    monkeypatch.setenv("GUESTFS_MEMORY_LIMIT", "100Mi")
    rc, out, _ = run(capsys, "explain", "--json", "--root", root)
    got = json.loads(out)
    assert got["memory"]["limit_bytes"] == 100 << 20
    assert got["memory"]["source"] == {"kind": "env", "file": "GUESTFS_MEMORY_LIMIT",
                                       "cgroup": None, "note": "100Mi"}


def test_errors_are_one_line_with_exit_status(capsys, monkeypatch):
    root = str(fixture_root("docker-v1"))
    rc, _, err = run(capsys, "explain", "--root", root, "--memory-limit", "plenty")
    assert rc == 1 and "plenty" in err and "Traceback" not in err
    rc, _, err = run(capsys, "explain", "--root", root, "--pid", "31337")
    assert rc == 1 and "pid 31337" in err
    rc, _, err = run(capsys, "explain", "--root", "/nonexistent-root")
    assert rc == 1 and "--root /nonexistent-root: no proc directory" in err
    monkeypatch.setenv("GUESTFS_CPU_ROUNDING", "sideways")
    rc, _, err = run(capsys, "explain", "--root", root)
    assert rc == 1 and "GUESTFS_CPU_ROUNDING" in err
    with pytest.raises(SystemExit) as e:
        main(["explain", "--cpu-rounding", "sideways"])
    assert e.value.code == 2


def test_show_and_explain_work_without_any_fuse_binding():
    """Only `guestfs mount` loads a FUSE binding: show and explain run where libfuse and
    fusepy/mfusepy are absent (a debugging shell in a minimal container)."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['fuse'] = None; sys.modules['mfusepy'] = None\n"
            "from guestfs.cli.main import main\n"
            f"root = {str(fixture_root('docker-v1'))!r}\n"
            "assert main(['show', '/proc/meminfo', '--root', root]) == 0\n"
            "assert main(['explain', '--root', root]) == 0\n"
            "assert 'fuse' not in sys.modules or sys.modules['fuse'] is None\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("MemTotal:         524288 kB\n")


def test_a_root_with_no_proc_is_named_not_the_pid(tmp_path):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "guestfs", "explain", "--root",
                          str(tmp_path / "nowhere")], capture_output=True, text=True)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        f"guestfs: --root {tmp_path / 'nowhere'}: no proc directory there (give the "
        "directory that holds the host's proc and sys)"]
