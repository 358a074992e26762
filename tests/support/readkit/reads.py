"""Every way of reading a file that the read-methods test checks, run as a program:
``python reads.py [--fgets BINARY] FILE...`` prints one JSON object
{method: {file: base64 of the bytes read, or "!" and the error}}.

A program, not test code, so that it can run as the CMD of `guestfs run` (the files bound
over /proc itself) as well as on a mount: it reads in-process (read loops, pread, sendfile,
splice, mmap, stdio through ctypes, open().read(), pathlib) and starts the other readers
(busybox cat, GNU cat and head, a C fgets program, one node and one java run for all the
files), which inherit its mount namespace."""

from __future__ import annotations

import base64
import ctypes
import errno
import json
import mmap
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
BIG = 1 << 20


def read_loop(bufsize: int) -> Callable[[str], bytes]:
    def read(path: str) -> bytes:
        fd = os.open(path, os.O_RDONLY)
        try:
            out = b""
            while chunk := os.read(fd, bufsize):
                out += chunk
            return out
        finally:
            os.close(fd)
    return read


def sendfile_to_pipe(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    r, w = os.pipe()
    try:
        out = b""
        while os.sendfile(w, fd, None, 65536):
            out += os.read(r, BIG)
        return out
    finally:
        for f in (fd, r, w):
            os.close(f)


def sendfile_to_file(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        with tempfile.TemporaryFile() as tmp:
            while os.sendfile(tmp.fileno(), fd, None, BIG):
                pass
            tmp.seek(0)
            return tmp.read()
    finally:
        os.close(fd)


def splice(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    r, w = os.pipe()
    try:
        out = b""
        while os.splice(fd, w, 65536):
            out += os.read(r, BIG)
        return out
    finally:
        for f in (fd, r, w):
            os.close(f)


def pread_at_zero(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, BIG, 0)
    finally:
        os.close(fd)


def pread_at_offsets(path: str) -> bytes:
    """pread at 0, then at offsets within the file: each must be the rest of that same
    rendering; past the end, empty."""
    fd = os.open(path, os.O_RDONLY)
    try:
        data = os.pread(fd, BIG, 0)
        n = len(data)
        for k in sorted({1, 7, n // 2, n - 1}):
            got = os.pread(fd, BIG, k)
            if got != data[k:]:
                raise ValueError(f"pread at {k} of {n}: {got[:40]!r} is not the rest "
                                 f"{data[k:k + 40]!r}")
        for k in (n, n + 1, n + 3 * mmap.PAGESIZE):
            if os.pread(fd, 100, k) != b"":
                raise ValueError(f"pread at {k}, past the end of {n} bytes, was not empty")
        return data
    finally:
        os.close(fd)


def mapped(flags: int) -> Callable[[str], bytes]:
    """The whole mapping of st_size bytes, touched to its end: the rendering, then only
    zeros (as a sysfs file mapped is)."""
    def read(path: str) -> bytes:
        fd = os.open(path, os.O_RDONLY)
        try:
            with mmap.mmap(fd, 0, flags=flags, prot=mmap.PROT_READ) as m:
                whole = m[:]
        finally:
            os.close(fd)
        text, _, rest = whole.partition(b"\0")
        if rest.strip(b"\0"):
            raise ValueError(f"bytes after the zeros that follow {len(text)} bytes")
        return text
    return read


libc = ctypes.CDLL(None, use_errno=True)
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.fgets.restype = ctypes.c_char_p
libc.fgets.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]


def libc_fgets(path: str) -> bytes:
    f = libc.fopen(path.encode(), b"r")
    if not f:
        raise OSError(ctypes.get_errno(), "fopen")
    try:
        buf = ctypes.create_string_buffer(64)
        out = b""
        while libc.fgets(buf, 64, f) is not None:
            out += buf.value
        return out
    finally:
        libc.fclose(f)


def python_open_read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def program(*argv: str) -> Callable[[str], bytes]:
    def read(path: str) -> bytes:
        if shutil.which(argv[0]) is None:
            raise FileNotFoundError(f"{argv[0]} is not installed (.ci/setup)")
        out = subprocess.run([*argv, path], capture_output=True, timeout=60)
        if out.returncode != 0:
            raise OSError(f"{argv[0]} exited {out.returncode}: {out.stderr[:200]!r}")
        return out.stdout
    return read


IN_PROCESS: dict[str, Callable[[str], bytes]] = {
    "read-7": read_loop(7),
    "read-1MiB": read_loop(BIG),
    "sendfile-pipe": sendfile_to_pipe,
    "sendfile-file": sendfile_to_file,
    "splice": splice,
    "pread-0": pread_at_zero,
    "pread-offsets": pread_at_offsets,
    "mmap-private": mapped(mmap.MAP_PRIVATE),
    "mmap-shared": mapped(mmap.MAP_SHARED),
    "libc-fgets": libc_fgets,
    "python-open-read": python_open_read,
    "python-read_text": lambda p: pathlib.Path(p).read_text().encode(),
    "busybox-cat": program("busybox", "cat"),
    "gnu-cat": program("cat"),
    "gnu-head": program("head", "-n", "1000000"),
}


def errtext(e: BaseException) -> str:
    if isinstance(e, OSError) and e.errno is not None:
        return f"!{errno.errorcode.get(e.errno, e.errno)} {e}"
    return f"!{type(e).__name__}: {e}"


def runtime(argv: list[str], files: list[str]) -> str | None:
    """One run of a runtime for every file, or the error text."""
    if shutil.which(argv[0]) is None:
        return f"!{argv[0]} is not installed (.ci/setup)"
    out = subprocess.run([*argv, *files], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        return f"!{argv[0]} exited {out.returncode}: {out.stderr[-400:]}"
    return out.stdout


def main(args: list[str]) -> None:
    fgets = None
    if args[:1] == ["--fgets"]:
        fgets, args = args[1], args[2:]
    results: dict[str, dict[str, str]] = {m: {} for m in IN_PROCESS}
    methods = dict(IN_PROCESS)
    if fgets is not None:
        methods["c-fgets"] = program(fgets)
        results["c-fgets"] = {}
    for f in args:
        for name, read in methods.items():
            try:
                results[name][f] = base64.b64encode(read(f)).decode()
            except Exception as e:  # recorded: the test says which reader failed how
                results[name][f] = errtext(e)
    node = runtime(["node", os.path.join(HERE, "reads.js")], args)
    if node is not None and not node.startswith("!"):
        results.update(json.loads(node))
    else:
        results["node"] = dict.fromkeys(args, node or "!no output")
    java = runtime(["java", os.path.join(HERE, "Reads.java")], args)
    if java is not None and not java.startswith("!"):
        for line in java.splitlines():
            method, f, data = line.split("\t", 2)
            results.setdefault(method, {})[f] = data
    else:
        results["java"] = dict.fromkeys(args, java or "!no output")
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1:])
