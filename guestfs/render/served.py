"""The paths guestfs serves, and which of them run and attach bind by default.

Names only, importing nothing: `guestfs run` needs them before anything else, and its
start-up time is the app's (daemon/file_table.py holds how each is rendered)."""

CPU_LIST_FILES = ("/sys/devices/system/cpu/online", "/sys/devices/system/cpu/possible",
                  "/sys/devices/system/cpu/present")
PRESSURE_FILES = ("/proc/pressure/cpu", "/proc/pressure/memory", "/proc/pressure/io")
SERVED_FILES = ("/proc/meminfo", "/proc/cpuinfo", "/proc/stat", "/proc/uptime",
                "/proc/loadavg", "/proc/swaps", "/proc/diskstats", *PRESSURE_FILES,
                *CPU_LIST_FILES)

# What `run` and `attach` bind over /proc and /sys by default. The pressure files are
# served in the mount but not bound: the kernel's /proc/pressure/* accept PSI triggers
# (write "some 150000 2000000", then poll() for POLLPRI; systemd-oomd and other monitors
# rely on it), and run's page-cached mount cannot take them (its opens never reach the
# daemon, daemon/psi_triggers.py), so binding ours over them would turn every trigger
# into EROFS. `run --bind-pressure` binds them.
BOUND_BY_DEFAULT = tuple(f for f in SERVED_FILES if f not in PRESSURE_FILES)
