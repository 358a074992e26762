"""`guestfs webhook` for tests: a CA and certificates made with openssl, the command
started as the shipped Deployment runs it (its arguments, with the address and the
certificate's files replaced) on 127.0.0.1, and an HTTPS client that trusts only that
CA."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import select
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.support.paths import REPO

DEPLOYMENT = REPO / "container" / "k8s" / "webhook" / "base" / "deployment.yaml"


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


def make_ca(where: Path, name: str = "ca") -> Pair:
    pair = Pair(where / f"{name}.crt", where / f"{name}.key")
    openssl("req", "-x509", "-new", "-nodes", "-newkey", "ec", "-pkeyopt",
            "ec_paramgen_curve:prime256v1", "-keyout", str(pair.key), "-out", str(pair.cert),
            "-days", "1", "-subj", f"/CN=guestfs-test-{name}",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign")
    return pair


def issue(ca: Pair, where: Path, name: str = "tls", san: str = "IP:127.0.0.1") -> Pair:
    """A serving certificate for ``san`` signed by ``ca``, written to new files."""
    key, csr, cert, ext = (where / f"{name}.{s}" for s in ("key", "csr", "crt", "ext"))
    openssl("req", "-new", "-nodes", "-newkey", "ec", "-pkeyopt",
            "ec_paramgen_curve:prime256v1", "-keyout", str(key), "-out", str(csr),
            "-subj", "/CN=guestfs-webhook-test")
    ext.write_text(f"subjectAltName={san}\nextendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca.cert), "-CAkey", str(ca.key),
            "-CAcreateserial", "-out", str(cert), "-days", "1", "-extfile", str(ext))
    return Pair(cert, key)


def shipped_args() -> list[str]:
    (c,) = yaml.safe_load(DEPLOYMENT.read_text())["spec"]["template"]["spec"]["containers"]
    return list(c["args"])


def replaced(args: list[str], values: dict[str, str]) -> list[str]:
    out = list(args)
    for opt, value in values.items():
        if opt in out:
            out[out.index(opt) + 1] = value
        else:
            out += [opt, value]
    return out


class Log:
    """The command's stderr, one JSON object a line, read without blocking (select on a
    buffered reader misses lines already in its buffer, so the descriptor is read)."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buf, self.lines = fd, b"", []

    def poll(self, timeout: float = 0) -> bool:
        """Read what is there (waiting up to timeout for something); False at EOF."""
        if not select.select([self.fd], [], [], timeout)[0]:
            return True
        chunk = os.read(self.fd, 65536)
        self.buf += chunk
        *done, self.buf = self.buf.split(b"\n")
        self.lines += [json.loads(line) for line in done if line.strip()]
        return bool(chunk)


class Webhook:
    """A running `guestfs webhook`; its JSON log lines are in .events()."""

    def __init__(self, proc: subprocess.Popen, port: int, ca: Path, log: Log) -> None:
        self.proc, self.port, self.ca, self.log = proc, port, ca, log

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))

    def request(self, method: str, path: str, body: bytes | None = None,
                timeout: float = 10) -> tuple[int, bytes]:
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.context(),
                                           timeout=timeout)
        try:
            headers = {"Content-Type": "application/json"} if body is not None else {}
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def post(self, path: str, doc: dict | bytes, timeout: float = 10) -> tuple[int, dict]:
        body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        status, data = self.request("POST", path, body, timeout)
        return status, json.loads(data)

    def events(self, settle: float = 0.2) -> list[dict]:
        """Every log line so far (each must be one JSON object), after ``settle`` seconds
        without a new one: a line is written just after its answer is sent."""
        while self.log.poll(settle) and select.select([self.log.fd], [], [], 0)[0]:
            pass
        return list(self.log.lines)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=15)
        while self.log.poll(0.1):
            pass
        return rc


@contextlib.contextmanager
def running(pair: Pair, ca: Path, extra: dict[str, str] | None = None,
            flags: tuple[str, ...] = ()) -> Iterator[Webhook]:
    args = replaced(shipped_args(), {"--listen": "127.0.0.1:0", "--tls-cert": str(pair.cert),
                                     "--tls-key": str(pair.key), **(extra or {})})
    proc = subprocess.Popen([sys.executable, "-m", "guestfs", *args, *flags], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stderr is not None
        log = Log(proc.stderr.fileno())
        deadline = time.monotonic() + 20
        while not any(e["event"] == "listening" for e in log.lines):
            assert time.monotonic() < deadline, log.lines
            assert log.poll(0.5), f"webhook exited {proc.wait()}: {log.lines} {log.buf!r}"
        listening = next(e for e in log.lines if e["event"] == "listening")
        port = int(listening["address"].rsplit(":", 1)[1])
        yield Webhook(proc, port, ca, log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
