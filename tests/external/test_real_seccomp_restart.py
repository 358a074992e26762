"""A restarted `guestfs seccomp-agent` serves the runc containers started before it: the
guard kept their listeners and hands them to the next agent. Between two agents, calls
get the node's values (never ENOSYS); two agents started at once never both serve.
Everything (containers, agents, the guard, the mount) is removed even when a test fails."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.external.test_real_runc import MiB
from tests.external.test_real_seccomp_agent import (
    agent_bundle,
    alive,
    containers,
    guard_rss_kib,
    handed_off_children,
    own_view_pages,
    require_runc,
    workdir,
)
from tests.support.fusemount import mounted, wait_for

pytestmark = pytest.mark.real


def guard_pids(*logs: Path) -> set[int]:
    return {int(m) for log in logs if log.exists()
            for m in re.findall(r"guard pid (\d+)", log.read_text(errors="replace"))}


@contextlib.contextmanager
def agents(top: Path, source: str) -> Iterator[tuple[object, str]]:
    """start(name) starts an agent logging to top/name.log; every agent is killed and the
    guard they shared is gone when the block ends."""
    sock = str(top / "agent" / "agent.sock")
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(name: str, *extra: str) -> tuple[subprocess.Popen[bytes], Path]:
        log = top / f"{name}.log"
        with open(log, "wb") as err:
            procs.append((subprocess.Popen(
                [sys.executable, "-m", "guestfs", "seccomp-agent", "--socket", sock,
                 "--source", source, "-v", *extra], stderr=err), log))
        return procs[-1]

    try:
        yield start, sock
    finally:
        for proc, _log in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        # The containers are gone by now, so the guard exits on its own.
        for pid in guard_pids(*(log for _p, log in procs)):
            if not wait_for(lambda pid=pid: not alive(pid), 5):
                os.kill(pid, signal.SIGKILL)


def serving(proc: subprocess.Popen[bytes], log: Path) -> bool:
    return "guard pid" in log.read_text(errors="replace") or proc.poll() is not None


def pages_and_cpus(proc: subprocess.Popen[str]) -> list[str]:
    assert proc.stdout is not None and proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    return [proc.stdout.readline().strip(), proc.stdout.readline().strip()]


ROUND = "getconf _PHYS_PAGES; nproc; read go; "


def host_answers() -> list[str]:
    """What the node itself answers ROUND's two questions with."""
    pages = subprocess.run(["getconf", "_PHYS_PAGES"], capture_output=True, text=True,
                           check=True).stdout.strip()
    return [pages, str(len(os.sched_getaffinity(0)))]


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
def test_a_restarted_agent_serves_the_running_container_again(stop):
    require_runc()
    host = host_answers()
    with workdir() as top, mounted(str(top / "mnt"), "--per-container"), \
            agents(top, str(top / "mnt")) as (start, sock):
        a, alog = start("a")
        assert wait_for(lambda: serving(a, alog)), "agent A did not start"
        assert a.poll() is None, alog.read_text()
        b = agent_bundle(top / "b", sock, "read go; " + ROUND * 3 + "true", 512 * MiB, 100000)
        with containers([b], stdin=subprocess.PIPE) as (proc,):
            assert pages_and_cpus(proc) == ["131072", "1"], alog.read_text()
            a.send_signal(stop)
            a.wait(10)
            assert pages_and_cpus(proc) == host       # between agents: the node's, no ENOSYS
            started = time.monotonic()
            b_proc, blog = start("b")
            assert wait_for(lambda: "taken back from the guard" in blog.read_text()
                            or b_proc.poll() is not None, 20), blog.read_text()
            back = time.monotonic() - started
            assert pages_and_cpus(proc) == ["131072", "1"], blog.read_text()
            (guard,) = guard_pids(alog, blog)         # one guard, across both agents
            print(f"agent B serving again {back:.2f} s after its start; guard {guard}: "
                  f"{guard_rss_kib(guard)}; {re.findall(r'served again .*', blog.read_text())}")
            proc.stdin.close()                       # type: ignore[union-attr]
            assert proc.wait(30) == 0, proc.stderr.read()   # type: ignore[union-attr]
        text = blog.read_text()
        assert "1 listeners taken back from the guard" in text, text
        assert "kept by the guard: answering from its own view" in text, text


def test_two_agents_started_at_once_one_serves_the_other_refuses():
    require_runc()
    with workdir() as top, mounted(str(top / "mnt"), "--per-container"), \
            agents(top, str(top / "mnt")) as (start, sock):
        (a, alog), (b, blog) = start("a"), start("b")
        assert wait_for(lambda: (serving(a, alog) and serving(b, blog))
                        and (a.poll() is not None or b.poll() is not None), 20), \
            alog.read_text() + blog.read_text()
        (loser, llog), (winner, wlog) = sorted([(a, alog), (b, blog)],
                                               key=lambda p: p[0].poll() is None)
        assert loser.wait(10) != 0 and winner.poll() is None, wlog.read_text()
        err = llog.read_text().strip().splitlines()
        assert len(err) == 1 and "another seccomp agent" in err[0], err
        bundle = agent_bundle(top / "b", sock, "getconf _PHYS_PAGES; nproc", 512 * MiB,
                              100000)
        with containers([bundle]) as (proc,):
            out, stderr = proc.communicate(timeout=60)
        assert out.split() == ["131072", "1"], stderr + wlog.read_text()
        assert len(guard_pids(alog, blog)) == 1


def test_the_daemonsets_standalone_guard_keeps_listeners_across_agents():
    """As in the DaemonSet: `guestfs seccomp-guard` runs on its own (the agent, started
    first with --external-guard, waits for it), outlives an agent's kill -9 and stays
    when its last container exits; SIGTERM does not stop it."""
    require_runc()
    with workdir() as top, mounted(str(top / "mnt"), "--per-container"), \
            agents(top, str(top / "mnt")) as (start, sock):
        a, alog = start("a", "--external-guard")
        assert wait_for(lambda: "waiting for the seccomp guard" in alog.read_text(), 10), \
            alog.read_text()
        guard = subprocess.Popen([sys.executable, "-m", "guestfs", "seccomp-guard", "--dir",
                                  str(top / "agent")], stderr=subprocess.PIPE)
        try:
            assert wait_for(lambda: serving(a, alog), 10) and a.poll() is None, \
                alog.read_text()
            assert guard_pids(alog) == {guard.pid}       # exec'd: the same process
            b = agent_bundle(top / "b", sock, "read go; " + ROUND * 2 + "true", 512 * MiB,
                             100000)
            with containers([b], stdin=subprocess.PIPE) as (proc,):
                assert pages_and_cpus(proc) == ["131072", "1"], alog.read_text()
                a.kill()
                a.wait()
                b_proc, blog = start("b", "--external-guard")
                assert wait_for(lambda: "taken back" in blog.read_text(), 20), \
                    blog.read_text()
                assert pages_and_cpus(proc) == ["131072", "1"], blog.read_text()
                proc.stdin.close()                       # type: ignore[union-attr]
                assert proc.wait(30) == 0
            guard.terminate()
            time.sleep(0.5)
            assert guard.poll() is None and b_proc.poll() is None
            print(f"standalone guard {guard.pid}: {guard_rss_kib(guard.pid)}")
        finally:
            guard.kill()
            guard.wait()


def test_a_guard_killed_under_a_living_agent_is_replaced_and_loses_nothing():
    """kill -9 of the guard while the agent serves: the agent starts a new guard and hands
    it every listener, so the agent's own kill -9 afterwards still leaves the container
    with the node's values (not ENOSYS), and the next agent serves it again."""
    require_runc()
    host = host_answers()
    with workdir() as top, mounted(str(top / "mnt"), "--per-container"), \
            agents(top, str(top / "mnt")) as (start, sock):
        a, alog = start("a")
        assert wait_for(lambda: serving(a, alog)) and a.poll() is None, alog.read_text()
        b = agent_bundle(top / "b", sock, "read go; " + ROUND * 4 + "true", 512 * MiB,
                         100000)
        with containers([b], stdin=subprocess.PIPE) as (proc,):
            assert pages_and_cpus(proc) == ["131072", "1"], alog.read_text()
            (old,) = guard_pids(alog)
            os.kill(old, signal.SIGKILL)
            assert wait_for(lambda: "handed to the new seccomp guard" in alog.read_text(),
                            10), alog.read_text()
            assert pages_and_cpus(proc) == ["131072", "1"], alog.read_text()
            a.kill()
            a.wait()
            assert pages_and_cpus(proc) == host, alog.read_text()
            b_proc, blog = start("b")
            assert wait_for(lambda: "taken back from the guard" in blog.read_text()
                            or b_proc.poll() is not None, 20), blog.read_text()
            assert pages_and_cpus(proc) == ["131072", "1"], blog.read_text()
            new = guard_pids(blog)
            assert len(new) == 1 and old not in new and new <= guard_pids(alog), \
                alog.read_text() + blog.read_text()
            proc.stdin.close()                       # type: ignore[union-attr]
            assert proc.wait(30) == 0


def test_a_restarted_agent_takes_back_many_listeners_at_once():
    """60 process trees with a listener each: after agent A's kill -9, agent B gets all
    60 back in one hand-back and answers every one from its own view."""
    require_runc()
    n = 60
    with workdir() as top, mounted(str(top / "mnt"), "--per-container"), \
            agents(top, str(top / "mnt")) as (start, sock):
        a, alog = start("a")
        assert wait_for(lambda: serving(a, alog)) and a.poll() is None, alog.read_text()
        want = own_view_pages(top / "mnt")
        with handed_off_children(sock, n) as (go, out):
            assert wait_for(lambda: alog.read_text().count("answering from its own") == n,
                            30), alog.read_text()[-2000:]
            a.kill()
            a.wait()
            b, blog = start("b")
            assert wait_for(lambda: "taken back from the guard" in blog.read_text()
                            or b.poll() is not None, 30), blog.read_text()
            print(re.findall(r"\d+ listeners taken back.*", blog.read_text()))
            os.write(go, b"x" * n)
            with os.fdopen(out) as results:
                lines = results.read().splitlines()
        assert f"{n} listeners taken back" in blog.read_text()
        assert [ln.split()[0] for ln in lines] == [str(want)] * n
