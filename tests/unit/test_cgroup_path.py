from guestfs.sources.cgroup_path import leaves_namespace, level_paths, pick_mount, relative_to_root
from guestfs.sources.mountinfo import CgroupMount
from guestfs.sources.proc_cgroup import parse_proc_cgroup


def v1(mount_point: str, root: str) -> CgroupMount:
    return CgroupMount(mount_point, root, 1, frozenset({"memory"}))


def test_root_stripped_on_whole_components_only():
    assert relative_to_root("/docker/abc/sub", "/docker/abc") == ["sub"]
    assert relative_to_root("/docker/abc", "/docker/abc") == []
    assert relative_to_root("/docker/abcdef", "/docker/abc") is None
    assert relative_to_root("/anything", "/") == ["anything"]


def test_dotdot_paths_leave_the_namespace():
    assert leaves_namespace("/../../../../../pause")
    assert leaves_namespace("/../cri-containerd-x.scope")
    assert not leaves_namespace("/kubepods.slice/x..y.scope")
    assert relative_to_root("/../pause", "/") is None


def test_levels_leaf_first_up_to_mount_root():
    m = v1("/sys/fs/cgroup/memory", "/docker/abc")
    levels = level_paths(m, "/docker/abc/a/b")
    assert [(lv.cgroup, lv.directory) for lv in levels] == [
        ("/docker/abc/a/b", "/sys/fs/cgroup/memory/a/b"),
        ("/docker/abc/a", "/sys/fs/cgroup/memory/a"),
        ("/docker/abc", "/sys/fs/cgroup/memory"),
    ]
    assert level_paths(m, "/docker/other") is None


def test_pick_mount_prefers_the_deepest_root_that_contains_the_path():
    top, deep = v1("/host/memory", "/"), v1("/sys/fs/cgroup/memory", "/docker/abc")
    assert pick_mount([top, deep], "/docker/abc") is deep
    assert pick_mount([top, deep], "/docker/xyz") is top
    assert pick_mount([deep], "/docker/xyz") is None


def test_parse_proc_cgroup_v1_v2_and_named():
    text = ("12:pids:/a\n9:cpu,cpuacct:/b\n1:name=systemd:/c\n0::/d e\n"
            "bogus\nx:memory:/y\n3:memory:relative\n")
    got = parse_proc_cgroup(text)
    assert [(m.hierarchy_id, sorted(m.controllers), m.path) for m in got] == [
        (12, ["pids"], "/a"), (9, ["cpu", "cpuacct"], "/b"), (1, ["name=systemd"], "/c"),
        (0, [], "/d e")]
    assert got[-1].is_v2 and not got[0].is_v2


def test_a_path_outside_our_namespace_matches_a_mount_root_outside_it_too():
    """Another container's cgroup2 mount read from our cgroup namespace: the kernel prints
    its root and the process's path with the same leading ``..`` (reader_root.py)."""
    app = "/../cri-containerd-x.scope"
    assert relative_to_root(app, app) is None                  # our own mounts never
    assert relative_to_root(app, app, outside_ok=True) == []
    assert relative_to_root(f"{app}/sub", app, outside_ok=True) == ["sub"]
    # ".." below the mount root would leave the mount: never a directory path.
    assert relative_to_root(app, "/", outside_ok=True) is None
    assert relative_to_root("/a/../b", "/a", outside_ok=True) is None
    m = CgroupMount("/proc/7/root/sys/fs/cgroup", app, 2, frozenset())
    assert [(lv.cgroup, lv.directory) for lv in level_paths(m, f"{app}/sub", True)] == [
        (f"{app}/sub", "/proc/7/root/sys/fs/cgroup/sub"), (app, "/proc/7/root/sys/fs/cgroup")]
