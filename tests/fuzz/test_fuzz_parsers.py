"""Hypothesis fuzzing of every parser of host and user input: each either returns a value
of its documented shape or raises its documented error (ValueError for cgroup files and
quantities, ExplicitLimitError for the limits directory); nothing else escapes, and
nothing hangs (huge ranges and exponents are bounded). Inputs that once crashed are kept
as explicit examples."""

from __future__ import annotations

import os
import tempfile
from fractions import Fraction

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from guestfs.engine.explicit import (
    ExplicitLimitError,
    ExplicitLimits,
    ExplicitSettings,
    collect_explicit,
)
from guestfs.engine.quantity import MAX_QUANTITY, parse_cpu_quantity, parse_memory_quantity
from guestfs.sources.cgroup_files import (
    MAX_CPU_ID,
    format_cpu_list,
    parse_cfs,
    parse_counter,
    parse_cpu_list,
    parse_cpu_max,
    parse_flat_keyed,
    parse_limit_bytes,
)
from guestfs.sources.cgroup_path import relative_to_root
from guestfs.sources.host_proc import parse_meminfo, parse_uptime
from guestfs.sources.host_root import HostRoot
from guestfs.sources.mountinfo import (
    CgroupMount,
    parse_mount_entries,
    parse_mountinfo,
    unescape,
)
from guestfs.sources.proc_cgroup import parse_proc_cgroup
from guestfs.sources.reader_root import ReaderMount, ReaderTable, reader_mount
from guestfs.sources.usage_parsers import (
    parse_blkio_recursive,
    parse_cpuacct_usage_all,
    parse_io_stat,
)
from tests.support.fuzzing import examples

FUZZ = settings(max_examples=examples(500), deadline=None,
                suppress_health_check=[HealthCheck.too_slow])

# Tokens that have broken parsers of numbers: unicode digits that str.isdigit() accepts
# and int() does not (or does), signs, underscores, huge and special floats.
SPECIAL = ["0", "1", "-1", "max", "nan", "inf", "-inf", "1e400", "1e999999999", "²", "٣",
           "1_000", "+5", "0x10", "9" * 30, "18446744073709551615", "-", "", "4294967296",
           "0-4294967295", "5-3", "0-", "-0", "1.5", "\\040", "\\134", "Mi", "1e-999999999"]
token = st.one_of(st.sampled_from(SPECIAL), st.integers(-2**70, 2**70).map(str),
                  st.text(max_size=6))
separator = st.sampled_from([" ", "\n", ":", ",", "-", "=", "\t", "", " - ", "::"])


@st.composite
def noisy_text(draw: st.DrawFn) -> str:
    """Text that looks like a kernel file often enough to get past the first check."""
    parts = draw(st.lists(st.tuples(token, separator), max_size=12))
    return "".join(a + b for a, b in parts)


texts = st.one_of(noisy_text(), st.text(max_size=80))


def returns_or_value_error(fn, *args):  # type: ignore[no-untyped-def]
    try:
        return fn(*args)
    except ValueError:
        return None


@FUZZ
@given(texts)
@example("0-99999999999")          # hung building a range of 10^11 CPUs
@example("0-4294967295,8")
def test_cpu_list(text):
    cpus = returns_or_value_error(parse_cpu_list, text)
    if cpus is not None:
        assert list(cpus) == sorted(set(cpus))
        assert all(0 <= c <= MAX_CPU_ID for c in cpus)
        assert parse_cpu_list(format_cpu_list(cpus)) == cpus


@FUZZ
@given(texts)
def test_single_value_files(text):
    for fn in (parse_counter, parse_limit_bytes):
        value = returns_or_value_error(fn, text)
        assert value is None or (isinstance(value, int) and value >= 0)
    quota = returns_or_value_error(parse_cpu_max, text)
    assert quota is None or (isinstance(quota, Fraction) and quota > 0)


@FUZZ
@given(texts, texts)
def test_cfs_quota_and_period(quota, period):
    value = returns_or_value_error(parse_cfs, quota, period)
    assert value is None or value > 0


@FUZZ
@given(texts)
@example("0\n0 0 -1 ")                                 # a negative cpuacct.usage_all counter
def test_keyed_files_never_raise(text):
    assert all(v >= 0 for v in parse_flat_keyed(text).values())
    for counters in parse_io_stat(text).values():
        assert min(vars(counters).values()) >= 0
    for counters in parse_blkio_recursive(text, text).values():
        assert min(vars(counters).values()) >= 0
    usage = returns_or_value_error(parse_cpuacct_usage_all, text)
    assert usage is None or min(usage) >= 0
    assert all(isinstance(v, int) for v in parse_meminfo(text).values())
    returns_or_value_error(parse_uptime, text)


@FUZZ
@given(texts)
@example("8:0 rbytes=² wbytes=1")                   # isdigit() but not int(): ValueError
@example("8:0 Read ²")
@example("cpu user system\n0 ² 1")
@example("cpu user system\n0 x 1")
def test_usage_files_with_unicode_digits(text):
    parse_io_stat(text)
    parse_blkio_recursive(text, text)
    returns_or_value_error(parse_cpuacct_usage_all, text)


mountinfo_line = st.builds(
    lambda fields, sep, rest: " ".join(fields + sep + rest),
    st.lists(st.one_of(token, st.sampled_from(["/", "/sys/fs/cgroup", "/a\\040b", "rw"])),
             max_size=8),
    st.lists(st.just("-"), max_size=2),
    st.lists(st.one_of(token, st.sampled_from(["cgroup", "cgroup2", "fuse.guestfs",
                                               "rw,memory", "rw,cpu,cpuacct"])), max_size=4))


@FUZZ
@given(st.lists(st.one_of(mountinfo_line, texts), max_size=6).map("\n".join))
@example("26 23 0:23 / /x rw - cgroup x")          # IndexError: no superopts field
@example("26 23 0:23 - /x rw - cgroup2 none rw")   # a root spelled "-"
def test_mountinfo(text):
    entries = parse_mount_entries(text)
    assert all(e.fstype and e.source for e in entries)
    for m in parse_mountinfo(text):
        assert m.version in (1, 2)
        assert m.version == 2 or "" not in m.controllers


reader_mount_line = st.builds(
    lambda mid, dev, root, point, fstype, opts: f"{mid} 1 {dev} {root} {point} ro - {fstype} "
                                                f"cgroup rw,{opts}",
    st.integers(0, 9), st.sampled_from(["0:31", "0:29", "0:99", "8:1", "x"]),
    st.sampled_from(["/", "/pod/app", "/pod", "/pod/app/sub", "/../app", "-"]),
    st.sampled_from(["/sys/fs/cgroup/memory", "/sys/fs/cgroup", "/sys/fs/cgroup/memory/x",
                     "/", "/sys"]),
    st.sampled_from(["cgroup", "cgroup2", "tmpfs"]), st.sampled_from(["memory", "cpu", ""]))


@FUZZ
@given(st.lists(st.one_of(reader_mount_line, mountinfo_line, texts), max_size=8)
       .map("\n".join), st.sampled_from(["/pod/app", "/pod/app/sub", "/../app", "/other"]))
@example("3 1 0:31 /pod/app /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory", "/pod/app")
@example("3 1 0:31 /../app /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory", "/../app")
def test_reader_mount_picks_only_an_unshadowed_mount_of_our_superblock(text, path):
    """Whatever a reader's mount table says, the mount used is a cgroup mount of the
    daemon's own superblock (0:31, the memory hierarchy here) that shows the path, with no
    other mount at or below it, under /proc/<pid>/root."""
    ours = [CgroupMount("/", "/pod/sidecar", 1, frozenset({"memory"}), "0:31", 5)]
    entries = tuple(parse_mount_entries(text))
    got = reader_mount(HostRoot(), ReaderTable("7", 1, entries), ours, path)
    if isinstance(got, ReaderMount):
        m = got.mount
        assert m.dev == "0:31" and m.version == 1
        assert m.mount_point.startswith("/proc/7/root")
        point = m.mount_point[len("/proc/7/root"):] or "/"
        assert relative_to_root(path, m.root, outside_ok=True) is not None
        assert [e for e in entries if e.mount_point == point
                or e.mount_point.startswith(point.rstrip("/") + "/")] \
            == [e for e in entries if e.mount_id == m.mount_id and e.mount_point == point]
    else:
        assert isinstance(got, str) and "\n" not in got


@FUZZ
@given(st.text())
def test_unescape(text):
    assert isinstance(unescape(text), str)


@FUZZ
@given(st.lists(st.one_of(
    st.builds(lambda h, c, p: f"{h}:{c}:{p}", token, st.sampled_from(["", "memory", "cpu,x"]),
              st.one_of(token, st.just("/a/b"))),
    texts), max_size=5).map("\n".join))
def test_proc_cgroup(text):
    for m in parse_proc_cgroup(text):
        assert m.path.startswith("/") and isinstance(m.hierarchy_id, int)


@FUZZ
@given(st.one_of(texts, st.builds(lambda n, s: f"{n}{s}", token,
                                  st.sampled_from(["", "m", "Mi", "Gi", "k", "E", "Ei", "n"]))))
@example("1e999999999")       # an exact billion-digit fraction: 100% CPU for ever
@example("1e-999999999")
@example("1e400")             # parsed, then meant "no limit"
@example("9" * 5000)          # int() refuses more than 4300 digits
def test_quantities(text):
    mem = returns_or_value_error(parse_memory_quantity, text)
    assert mem is None or 0 < mem <= MAX_QUANTITY + 1
    cpu = returns_or_value_error(parse_cpu_quantity, text)
    assert cpu is None or 0 < cpu <= MAX_QUANTITY


@FUZZ
@given(st.integers(1, MAX_QUANTITY),
       st.sampled_from([("", 1), ("Ki", 1024), ("M", 10**6), ("Gi", 2**30)]))
def test_valid_quantities_round_trip(n, suffix):
    name, mult = suffix
    if n * mult <= MAX_QUANTITY:
        assert parse_memory_quantity(f"{n}{name}") == n * mult


limit_file = st.one_of(st.binary(max_size=64), texts.map(lambda t: t.encode("utf-8", "replace")),
                       st.sampled_from([b"134217728", b"1", b"250", b"\xff\xfe", b"1e400\n"]))


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(limit_file, limit_file, st.sampled_from([None, "1", "1m", "1Mi", "0", "x"]))
@example(b"\xe9", b"1", None)                       # UnicodeDecodeError escaped
@example(b"lots", b"1", None)                       # silently ignored
@example(b"1", b"8796100000000", "1Mi")              # past 2^63 only once times the divisor
def test_limits_dir(memory, cpu, divisor):
    with tempfile.TemporaryDirectory() as d:
        for name, data in (("limits.memory", memory), ("limits.cpu", cpu)):
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)
        try:
            lim = collect_explicit(ExplicitSettings(limits_dir=d, cpu_divisor=divisor,
                                                    memory_divisor=divisor))
        except ExplicitLimitError as e:
            assert "\n" not in str(e)
            return
    assert isinstance(lim, ExplicitLimits)
    assert all(0 < c.value <= MAX_QUANTITY for c in (*lim.memory, *lim.cpu))
