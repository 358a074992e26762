"""A stress reader: ``python mapper.py MODE ROUNDS SHAPES_JSON FILE...`` reads each FILE
ROUNDS times by MODE (mmap: a private mapping of st_size touched to its end; sendfile;
read) and prints {"reads": n, "not_whole": count, "bad": [up to 5 of them]}. A good read
is one whole rendering: for a mapping, the rendering then only zeros; lines with the first
words and field counts given for its file in SHAPES_JSON, the last one ending in a
newline."""

from __future__ import annotations

import json
import mmap
import os
import re
import sys


def shape(data: bytes) -> list[list[object]]:
    out: list[list[object]] = []
    for line in data.decode(errors="replace").split("\n"):
        words = line.split()
        first = words[0] if words else ""
        out.append(["#" if re.fullmatch(r"[\d.]+", first) else first, len(words)])
    return out


def by_mmap(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        with mmap.mmap(fd, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ) as m:
            whole = m[:]
    finally:
        os.close(fd)
    text, _, rest = whole.partition(b"\0")
    return text if not rest.strip(b"\0") else whole


def by_sendfile(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    r, w = os.pipe()
    try:
        out = b""
        while os.sendfile(w, fd, None, 65536):
            out += os.read(r, 1 << 20)
        return out
    finally:
        for f in (fd, r, w):
            os.close(f)


def by_read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def main() -> None:
    mode, rounds, shapes, files = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), \
        sys.argv[4:]
    read = {"mmap": by_mmap, "sendfile": by_sendfile, "read": by_read}[mode]
    bad: list[str] = []
    n = nbad = 0
    for _ in range(rounds):
        for f in files:
            data = read(f)
            n += 1
            if shape(data) != shapes[f]:
                nbad += 1
                if len(bad) < 5:
                    bad.append(f"{f}: {len(data)} bytes ...{data[-120:]!r}")
    print(json.dumps({"reads": n, "not_whole": nbad, "bad": bad}))


if __name__ == "__main__":
    main()
