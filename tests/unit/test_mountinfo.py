from guestfs.sources.mountinfo import parse_mountinfo, unescape

HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset,clone_children
35 31 0:32 /docker/abc /sys/fs/cgroup/memory rw,relatime shared:9 master:3 - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate
50 27 0:40 / /mnt/my\\040cgroups rw - cgroup2 none rw
garbage line without separator
52 27 0:41 / /proc rw - proc proc rw
"""


def test_finds_every_cgroup_mount_with_controllers_and_roots():
    mounts = parse_mountinfo(HYBRID)
    assert [m.mount_point for m in mounts] == [
        "/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpuset", "/sys/fs/cgroup/memory",
        "/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified", "/mnt/my cgroups"]
    cpu, cpuset, memory, systemd, unified, spaced = mounts
    assert cpu.version == 1 and cpu.controllers == {"cpu", "cpuacct"}
    assert cpuset.controllers == {"cpuset"}  # clone_children is an option, not a controller
    assert memory.root == "/docker/abc"
    assert systemd.controllers == {"name=systemd"}
    assert unified.version == 2 and unified.controllers == frozenset()
    assert spaced.mount_point == "/mnt/my cgroups"


def test_unescape_octal():
    assert unescape(r"/a\040b\011c\134d") == "/a b\tc\\d"


def test_optional_fields_do_not_confuse_the_separator():
    line = "26 23 0:23 / /sys/fs/cgroup rw shared:4 master:1 propagate_from:2 - cgroup2 cgroup2 rw"
    (m,) = parse_mountinfo(line)
    assert m.mount_point == "/sys/fs/cgroup" and m.version == 2


def test_empty_and_truncated_input():
    assert parse_mountinfo("") == []
    assert parse_mountinfo("26 23 0:23 / /x rw - cgroup2") == []
