"""Renderers: pure functions from host file text + effective limits + usage to file text,
in the kernel's exact formats (procps, glibc, psutil, libuv and the JVM parse them)."""
