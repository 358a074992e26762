"""`guestfs webhook` as the command, over HTTPS on 127.0.0.1 with a CA made here, run with
the shipped Deployment's arguments: real AdmissionReview requests, the health routes, and
the faults a server on a cluster's network meets (garbage, the wrong kind, a 10 MB body,
half a request that stalls, a stalled TLS handshake, many slow clients beside a good
request), its certificate replaced while it runs, and SIGTERM."""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time

import pytest

from tests.support import admission, jsonpatch
from tests.support.paths import REPO
from tests.support.webhook_pods import SHAPES
from tests.support.webhookd import issue, make_ca, running

TIMEOUT = 2.0       # --request-timeout for these tests, so that a cut shows quickly


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    where = tmp_path_factory.mktemp("webhook-certs")
    ca = make_ca(where)
    return ca, issue(ca, where)


@pytest.fixture(scope="module")
def webhook(certs):
    ca, pair = certs
    with running(pair, ca.cert, {"--request-timeout": str(TIMEOUT),
                                 "--max-connections": "64"}) as w:
        yield w
        assert w.proc.poll() is None, "the webhook died during the tests"


def no_tracebacks(w) -> None:
    for e in w.events():
        assert "Traceback" not in json.dumps(e), e


def test_health_routes(webhook):
    assert webhook.request("GET", "/healthz") == (200, b"ok\n")
    assert webhook.request("GET", "/readyz") == (200, b"ok\n")
    assert webhook.request("GET", "/metrics")[0] == 404
    assert webhook.request("POST", "/other", b"{}")[0] == 404


def test_a_deployment_pod_in_a_labelled_namespace_is_mutated(webhook):
    s = SHAPES["deployment"]
    pod = admission.as_admitted(s.pod())
    request = admission.review(pod, s.namespace)
    status, answer = webhook.post("/mutate", request)
    assert status == 200
    ops = admission.patch_of(answer, request)
    out = jsonpatch.apply(pod, ops)
    mounts = {m["mountPath"] for m in out["spec"]["containers"][0]["volumeMounts"]}
    assert {"/proc/meminfo", "/proc/cpuinfo", "/sys/devices/system/cpu/online"} <= mounts
    assert out["spec"]["securityContext"]["seccompProfile"]["type"] == "Localhost"
    (line,) = [e for e in webhook.events() if e.get("uid") == request["request"]["uid"]]
    assert (line["event"], line["namespace"], line["pod"], line["ops"]) == \
        ("review", "team-a", "shop-5d8f7c9b4-*", len(ops))
    # Sent to the other route, the same pod without the annotation is left alone.
    request = admission.review(pod, "team-b")
    status, answer = webhook.post("/mutate/annotated", request)
    assert status == 200 and admission.patch_of(answer, request) == []


@pytest.mark.parametrize("body,status,message", [
    (b"{garbage", 400, "not JSON"),
    (b'{"apiVersion": "v1", "kind": "Pod"}', 400, "expected apiVersion"),
    (b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {}}',
     400, "expected apiVersion"),
    (b"", 400, "not JSON"),
])
def test_malformed_requests_get_an_admission_review_error(webhook, body, status, message):
    got, answer = webhook.post("/mutate", body)
    assert got == status
    assert answer["kind"] == "AdmissionReview" and answer["response"]["allowed"] is False
    assert message in answer["response"]["status"]["message"]
    assert webhook.request("GET", "/healthz")[0] == 200
    no_tracebacks(webhook)


def test_a_review_of_another_kind_is_allowed_unchanged(webhook):
    request = admission.review({"metadata": {"name": "d"}, "spec": {}}, "team-a")
    request["request"]["kind"] = {"group": "apps", "version": "v1", "kind": "Deployment"}
    status, answer = webhook.post("/mutate", request)
    assert status == 200 and admission.patch_of(answer, request) == []


def raw_tls(webhook) -> ssl.SSLSocket:
    sock = socket.create_connection(("127.0.0.1", webhook.port), timeout=30)
    return webhook.context().wrap_socket(sock, server_hostname="127.0.0.1")


def read_all(sock: socket.socket) -> bytes:
    out = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ssl.SSLError, ConnectionResetError):
            break
        if not chunk:
            break
        out += chunk
    return out


def test_a_10_mb_body_is_refused_without_being_read(webhook):
    body = b'{"x": "' + b"a" * (10 << 20) + b'"}'
    t = time.monotonic()
    with raw_tls(webhook) as s:
        s.sendall(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
        s.sendall(body[:65536])       # the rest is never needed
        reply = read_all(s)
    assert reply.startswith(b"HTTP/1.0 413 ") or reply.startswith(b"HTTP/1.1 413 "), reply[:200]
    assert time.monotonic() - t < TIMEOUT
    # Through the ordinary client, the whole 10 MB: refused alike, the server unharmed.
    try:
        status, _ = webhook.request("POST", "/mutate", body, timeout=30)
        assert status == 413
    except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
        pass      # the server closed while the client was still sending: also a refusal
    assert webhook.request("GET", "/healthz")[0] == 200
    (line,) = [e for e in webhook.events() if e["event"] == "request-too-large"][-1:]
    assert line["bytes"] == len(body)


def test_a_request_without_a_length_is_refused(webhook):
    with raw_tls(webhook) as s:
        s.sendall(b"POST /mutate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                  b"2\r\n{}\r\n0\r\n\r\n")
        assert read_all(s).split(b"\r\n", 1)[0].split()[1] == b"411"


def test_half_a_request_that_stalls_is_cut_at_the_deadline(webhook):
    with raw_tls(webhook) as s:
        s.sendall(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"api")
        t = time.monotonic()
        assert read_all(s) == b""          # no answer: the connection is closed
        took = time.monotonic() - t
    assert TIMEOUT - 0.5 < took < TIMEOUT + 2, took
    assert webhook.request("GET", "/healthz")[0] == 200


def test_a_client_trickling_its_headers_is_cut_at_the_deadline(webhook):
    """No single read waits long, so only a deadline for the whole connection ends it."""
    with raw_tls(webhook) as s:
        s.settimeout(0.5)
        t = time.monotonic()
        closed = False
        for ch in b"POST /mutate HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 50:
            try:
                s.sendall(bytes([ch]))
                time.sleep(0.05)
                if s.recv(1) == b"":
                    closed = True
                    break
            except TimeoutError:
                continue
            except (OSError, ssl.SSLError):
                closed = True
                break
        took = time.monotonic() - t
    assert closed and took < TIMEOUT + 2, took


def test_a_stalled_tls_handshake_is_cut_at_the_deadline(webhook):
    with socket.create_connection(("127.0.0.1", webhook.port), timeout=30) as s:
        t = time.monotonic()
        assert s.recv(1) == b""            # we never said hello; the server hung up
        assert TIMEOUT - 0.5 < time.monotonic() - t < TIMEOUT + 2


def test_many_slow_clients_do_not_delay_a_good_request(webhook):
    """40 connections that stall (20 before their handshake, 20 in their request) hold one
    thread each; a good review on a new connection is answered at once."""
    stalled = []
    for i in range(40):
        sock = socket.create_connection(("127.0.0.1", webhook.port), timeout=30)
        if i % 2:
            sock = webhook.context().wrap_socket(sock, server_hostname="127.0.0.1")
            sock.sendall(b"POST /mutate HTTP/1.1\r\nContent-Length: 5000\r\n\r\n{")
        stalled.append(sock)
    try:
        s = SHAPES["job"]
        request = admission.review(s.pod(), s.namespace)
        times = []
        for _ in range(5):
            t = time.monotonic()
            status, answer = webhook.post("/mutate", request)
            times.append(time.monotonic() - t)
            assert status == 200 and admission.patch_of(answer, request)
        print(f"good review beside 40 stalled clients: {max(times) * 1000:.1f} ms at most")
        assert max(times) < 1.0, times
    finally:
        for sock in stalled:
            sock.close()


def test_concurrent_good_requests_are_all_answered(webhook):
    s = SHAPES["init-containers"]
    results: list[int] = []

    def one() -> None:
        request = admission.review(s.pod(), s.namespace)
        status, answer = webhook.post("/mutate", request)
        if status == 200 and admission.patch_of(answer, request):
            results.append(status)

    threads = [threading.Thread(target=one) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 20


def served_serial(port: int, ca) -> int:
    ctx = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
        return int(s.getpeercert()["serialNumber"], 16)


def serial_of(path) -> int:
    import subprocess

    out = subprocess.run(["openssl", "x509", "-in", str(path), "-noout", "-serial"],
                         capture_output=True, text=True, check=True).stdout
    return int(out.strip().split("=")[1], 16)


def test_the_certificate_is_reloaded_when_its_files_change(tmp_path):
    """As cert-manager's renewal through kubelet's Secret volume (new files renamed over
    the old) and make-certs.sh (key, then certificate): the next connection gets the new
    certificate, with no restart; a half-written pair keeps the old one serving."""
    ca = make_ca(tmp_path)
    live = issue(ca, tmp_path, "live")
    with running(live, ca.cert) as w:
        first = served_serial(w.port, ca.cert)
        assert first == serial_of(live.cert)
        # A key that does not match the certificate: the old pair keeps serving.
        other = issue(ca, tmp_path, "other")
        other.key.replace(live.key)
        assert served_serial(w.port, ca.cert) == first
        assert any(e["event"] == "certificate-reload-failed" for e in w.events())
        # The matching certificate arrives: served from the next connection on.
        want = serial_of(other.cert)
        other.cert.replace(live.cert)
        assert served_serial(w.port, ca.cert) == want != first
        assert any(e["event"] == "certificate-reloaded" for e in w.events())
        assert w.stop() == 0


def test_make_certs_sh_makes_a_pair_the_webhook_serves(tmp_path):
    import subprocess

    script = REPO / "container" / "k8s" / "webhook" / "make-certs.sh"
    out = subprocess.run(["bash", str(script), "--dir", str(tmp_path), "--san",
                          "IP:127.0.0.1"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    from tests.support.webhookd import Pair

    pair = Pair(tmp_path / "tls.crt", tmp_path / "tls.key")
    with running(pair, tmp_path / "ca.crt") as w:
        s = SHAPES["deployment"]
        request = admission.review(s.pod(), s.namespace)
        status, answer = w.post("/mutate", request)
        assert status == 200 and admission.patch_of(answer, request)
        # A renewal keeps the CA (no new caBundle) and the running webhook takes it up.
        before = served_serial(w.port, tmp_path / "ca.crt")
        again = subprocess.run(["bash", str(script), "--dir", str(tmp_path), "--san",
                                "IP:127.0.0.1"], capture_output=True, text=True, timeout=60)
        assert again.returncode == 0, again.stderr
        assert served_serial(w.port, tmp_path / "ca.crt") == serial_of(pair.cert) != before
    names = subprocess.run(["openssl", "x509", "-in", str(pair.cert), "-noout", "-ext",
                            "subjectAltName"], capture_output=True, text=True).stdout
    assert "DNS:guestfs-webhook.kube-system.svc" in names


def test_sigterm_stops_it_cleanly_and_readyz_says_so_meanwhile(certs):
    ca, pair = certs
    with running(pair, ca.cert) as w:
        assert w.request("GET", "/readyz")[0] == 200
        assert w.stop() == 0
        assert [e["event"] for e in w.events()][-1] == "stopping"


def test_bad_command_lines_are_one_line_errors(certs, tmp_path):
    import subprocess
    import sys

    ca, pair = certs
    base = [sys.executable, "-m", "guestfs", "webhook", "--tls-cert", str(pair.cert),
            "--tls-key", str(pair.key)]
    for extra, message in (
            (["--listen", "nowhere"], "give ADDR:PORT"),
            (["--listen", "127.0.0.1:0", "--files", "meminfo,pressure/io"], "runc refuses"),
            (["--listen", "127.0.0.1:0", "--max-connections", "0"], "must be >= 1")):
        out = subprocess.run(base + extra, capture_output=True, text=True, timeout=30,
                             cwd=REPO)
        assert out.returncode == 1 and message in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    out = subprocess.run([sys.executable, "-m", "guestfs", "webhook", "--listen",
                          "127.0.0.1:0", "--tls-cert", str(tmp_path / "none.crt"),
                          "--tls-key", str(pair.key)], capture_output=True, text=True,
                         timeout=30, cwd=REPO)
    assert out.returncode == 1 and "none.crt" in out.stderr, out.stderr


def test_connections_past_the_bound_are_closed_at_once_and_served_again_later(certs):
    ca, pair = certs
    with running(pair, ca.cert, {"--max-connections": "4", "--request-timeout": "1.5"}) as w:
        held = [socket.create_connection(("127.0.0.1", w.port), timeout=30) for _ in range(4)]
        try:
            time.sleep(0.3)                 # accepted, each in its handshake
            with socket.create_connection(("127.0.0.1", w.port), timeout=30) as extra:
                t = time.monotonic()
                assert extra.recv(1) == b""
                assert time.monotonic() - t < 1.0
            assert any(e["event"] == "connection-refused" for e in w.events())
        finally:
            for s in held:
                s.close()
        time.sleep(0.3)
        assert w.request("GET", "/healthz")[0] == 200


def test_it_listens_on_ipv6_too(certs, tmp_path):
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this Python")
    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
    except OSError as e:
        pytest.skip(f"no IPv6 loopback here: {e}")
    ca = make_ca(tmp_path)
    pair = issue(ca, tmp_path, san="IP:::1")
    with running(pair, ca.cert, {"--listen": "[::1]:0"}) as w:
        ctx = ssl.create_default_context(cafile=str(ca.cert))
        with socket.create_connection(("::1", w.port), timeout=10) as raw, \
                ctx.wrap_socket(raw, server_hostname="::1") as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_all(s).endswith(b"\r\n\r\nok\n")


def test_a_failure_inside_the_handler_is_one_log_line_and_the_server_serves_on(
        certs, monkeypatch, caplog):
    """In process, with admission itself broken: the connection is closed unanswered (the
    API server then applies failurePolicy: Ignore), the log says where in one JSON line,
    and the next request is served."""
    import logging

    from guestfs.webhook import server
    from guestfs.webhook.inject import Options

    ca, pair = certs

    def broken(*_args):
        raise RuntimeError("boom")

    monkeypatch.setattr(server, "admit", broken)
    caplog.set_level(logging.DEBUG, logger="guestfs.webhook")
    srv = server.serve(("127.0.0.1", 0), server.Certificate(str(pair.cert), str(pair.key)),
                       Options(), server.Limits(1 << 20, TIMEOUT, 8))
    try:
        ctx = ssl.create_default_context(cafile=str(ca.cert))
        port = srv.server_address[1]
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            s.sendall(b"POST /mutate HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}")
            assert read_all(s) == b""
        failed = [json.loads(r.getMessage()) for r in caplog.records
                  if "handler-failed" in r.getMessage()]
        (line,) = failed
        assert line["error"] == "RuntimeError('boom')" and "test_webhook_https.py" in line["at"]
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
            assert read_all(s).endswith(b"ok\n")
    finally:
        server.stop(srv)


def test_make_certs_sh_apply_makes_the_secret_and_patches_both_ca_bundles(tmp_path):
    """With a kubectl on PATH that records what it is asked (no cluster here): the Secret
    is the one the Deployment mounts, and the JSONPatch, applied to the shipped
    configuration, sets the CA as the caBundle of both webhooks."""
    import base64
    import os
    import subprocess

    import yaml

    calls = tmp_path / "calls"
    calls.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "kubectl"
    # One file a call: the two ends of make-certs.sh's pipe run at once, in either order.
    fake.write_text('#!/bin/sh\nf=$(mktemp ' + str(calls) + '/call.XXXXXX)\n'
                    'printf "%s\\0" "$@" > "$f"\n'
                    # apply reads what it is given, as kubectl does: else the writer
                    # of the pipe may die of SIGPIPE (exit 141 under pipefail).
                    'if [ "$1" = apply ]; then cat > /dev/null; fi\n'
                    'if [ "$1" = -n ]; then echo "kind: Secret"; fi\n')
    fake.chmod(0o755)
    script = REPO / "container" / "k8s" / "webhook" / "make-certs.sh"
    out = subprocess.run(["bash", str(script), "--dir", str(tmp_path / "certs"), "--apply"],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert out.returncode == 0, out.stderr
    argvs = {tuple(p.read_text().split("\0")[:-1]) for p in calls.iterdir()}
    assert len(argvs) == 3, argvs
    (create,) = [list(a) for a in argvs if "create" in a]
    (apply,) = [list(a) for a in argvs if a[0] == "apply"]
    (patch,) = [list(a) for a in argvs if a[0] == "patch"]
    assert create[:6] == ["-n", "kube-system", "create", "secret", "tls", "guestfs-webhook-tls"]
    assert apply == ["apply", "-f", "-"]
    assert patch[:5] == ["patch", "mutatingwebhookconfiguration", "guestfs-webhook", "--type",
                         "json"]
    ops = json.loads(patch[6])
    config = yaml.safe_load((REPO / "container" / "k8s" / "webhook" / "base" /
                             "webhook.yaml").read_text())
    patched = jsonpatch.apply(config, ops)
    bundle = base64.b64encode((tmp_path / "certs" / "ca.crt").read_bytes()).decode()
    assert [h["clientConfig"]["caBundle"] for h in patched["webhooks"]] == \
        [bundle] * len(config["webhooks"])
    import kubernetes_validate

    kubernetes_validate.validate(patched, "1.33", strict=True)
