"""The cgroup v2 batch: one boot of the test VM runs every test in tests/external/vm/guest_v2.py;
each is reported here as its own pass or failure, with the guest's message."""

from __future__ import annotations

import ast
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.external.vm.boot import run_in_vm
from tests.support.paths import REPO

pytestmark = pytest.mark.real
GUEST = Path(__file__).resolve().with_name("guest_v2.py")
GUEST_TESTS = [n.name for n in ast.parse(GUEST.read_text()).body
               if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]


@pytest.fixture(scope="session")
def vm_batch(tmp_path_factory):
    results = tmp_path_factory.mktemp("vm-results")
    cmd = (f"cd {REPO} && PYTHONDONTWRITEBYTECODE=1 TMPDIR=/run {sys.executable} -m pytest "
           f"-p no:cacheprovider -q -rA {GUEST.relative_to(REPO)} "
           f"--junitxml=/mnt/junit.xml -o junit_family=xunit2")
    run = run_in_vm(cmd, results)
    print(f"VM batch: {run.seconds:.1f} s, guest pytest rc={run.returncode}")
    print("\n".join(ln for ln in run.console.splitlines() if not ln.startswith("[")))
    junit = results / "junit.xml"
    if not junit.exists():
        pytest.fail(f"the VM produced no results (rc={run.returncode}):\n{run.console[-6000:]}")
    cases = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        # (An Element without children is falsy: test each find against None.)
        problem = next((p for p in (case.find(t) for t in ("failure", "error", "skipped"))
                        if p is not None), None)
        cases[case.get("name")] = (problem.tag if problem is not None else "passed",
                                   (problem.get("message", "") + "\n" + (problem.text or ""))
                                   if problem is not None else "")
    records = results / "records.jsonl"
    recs = [json.loads(x) for x in records.read_text().splitlines()] if records.exists() else []
    for r in recs:
        print("VM record:", json.dumps(r))
    return cases, run


@pytest.mark.parametrize("name", GUEST_TESTS)
def test_in_the_cgroup_v2_vm(vm_batch, name):
    cases, run = vm_batch
    assert name in cases, f"{name} did not run in the VM:\n{run.console[-4000:]}"
    status, text = cases[name]
    assert status == "passed", f"{status} in the VM:\n{text[-4000:]}"
