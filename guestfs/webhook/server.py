"""The HTTPS server: POST /mutate (namespaces the configuration's namespaceSelector
selected) and POST /mutate/annotated (any other namespace: only pods annotated
io.guestfs.enable=true), GET /healthz and /readyz. One request per connection, each
connection bounded in size and in time as a whole, the TLS handshake made in the
connection's own thread (a client that stalls in it holds only that thread), and the
certificate reloaded when its files change (cert-manager renews them in place)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import ssl
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from guestfs.webhook.admit import admit
from guestfs.webhook.events import event
from guestfs.webhook.inject import Options

ROUTES = {"/mutate": True, "/mutate/annotated": False}   # path -> namespace selected
# What a refused request may still send before the connection closes (see _linger).
LINGER = 1 << 20
LINGER_SECONDS = 1.0


@dataclass(frozen=True)
class Limits:
    """The request body's largest size, a connection's whole time, and how many
    connections are served at once (the defaults are the command line's)."""

    max_body: int
    timeout: float
    max_connections: int


class Certificate:
    """The TLS context, rebuilt when the certificate's or the key's file changes (by
    inode, size or mtime: a rename over it, as kubelet's Secret volumes do, is a new
    inode). A pair that fails to load (one file written, the other not yet) keeps the
    previous context until the next connection tries again."""

    def __init__(self, cert: str, key: str) -> None:
        self.cert, self.key = cert, key
        self._lock = threading.Lock()
        self._stamp = self._stat()
        self._context = self._load()

    def _stat(self) -> tuple[tuple[int, int, int], ...]:
        out = []
        for path in (self.cert, self.key):
            st = os.stat(path)
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(out)

    def _load(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert, self.key)
        return ctx

    def context(self) -> ssl.SSLContext:
        with self._lock:
            try:
                stamp = self._stat()
                if stamp != self._stamp:
                    self._context = self._load()
                    self._stamp = stamp
                    event(logging.INFO, "certificate-reloaded", cert=self.cert)
            except (OSError, ssl.SSLError) as e:
                event(logging.WARNING, "certificate-reload-failed", error=str(e)[:200])
            return self._context


class WebhookServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], certificate: Certificate, options: Options,
                 limits: Limits) -> None:
        self.certificate, self.options, self.limits = certificate, options, limits
        self.slots = threading.BoundedSemaphore(limits.max_connections)
        self.stopping = threading.Event()
        # http.server listens on IPv4 only; "::" (every address, both families on Linux)
        # and any IPv6 address need an IPv6 socket.
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        # Past the bound a connection is closed at once: better a failed call (the
        # configuration's failurePolicy: Ignore) than an unbounded number of threads.
        if not self.slots.acquire(blocking=False):
            event(logging.WARNING, "connection-refused", client=client_address[0],
                  reason="too many connections")
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except Exception:
            self.slots.release()
            raise

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver's default prints a traceback over many lines; the log stays one
        # JSON object a line, naming where it failed.
        e = sys.exc_info()[1]
        where = traceback.extract_tb(e.__traceback__)[-1] if e is not None else None
        event(logging.ERROR, "handler-failed", client=client_address[0],
              error=repr(e)[:200], at=f"{where.filename}:{where.lineno}" if where else "")

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        deadline = Deadline(request, self.limits.timeout)
        try:
            request.settimeout(self.limits.timeout)
            tls = self.certificate.context().wrap_socket(request, server_side=True)
            try:
                self.finish_request(tls, client_address)
            finally:
                tls.close()
        except OSError as e:      # ssl.SSLError too: a failed handshake, a cut connection
            event(logging.DEBUG, "connection-failed", client=client_address[0],
                  error=str(e)[:200])
        except Exception:
            self.handle_error(request, client_address)
        finally:
            deadline.end()
            self.shutdown_request(request)
            self.slots.release()


class Deadline:
    """Ends a connection, handshake included, at its deadline: a client that sends half a
    request and stalls, or trickles it a byte at a time (which no per-read timeout
    catches), is cut off, not waited for. The cut goes through a duplicate of the
    socket's descriptor (shutdown acts on the connection, whichever descriptor names it),
    since the TLS wrapper takes the original over; the duplicate is kept until the
    connection's end, so a cut can never reach a later connection's descriptor."""

    def __init__(self, sock: socket.socket, seconds: float) -> None:
        self._dup = socket.socket(fileno=os.dup(sock.fileno()))
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._cut)
        self._timer.daemon = True
        self._timer.start()

    def _cut(self) -> None:
        with self._lock:
            if self._dup.fileno() >= 0:
                event(logging.WARNING, "request-timeout")
                with contextlib.suppress(OSError):
                    self._dup.shutdown(socket.SHUT_RDWR)

    def end(self) -> None:
        self._timer.cancel()
        with self._lock:
            self._dup.close()


class Handler(BaseHTTPRequestHandler):
    server: WebhookServer
    server_version = "guestfs-webhook"
    sys_version = ""

    def do_GET(self) -> None:
        if self.path == "/healthz":
            self._send(200, b"ok\n", "text/plain")
        elif self.path == "/readyz":
            if self.server.stopping.is_set():
                self._send(503, b"stopping\n", "text/plain")
            else:
                self._send(200, b"ok\n", "text/plain")
        else:
            self._send(404, b"not found\n", "text/plain")

    def do_POST(self) -> None:
        started = time.monotonic()
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self._json(411, {"error": "a Content-Length is required"}, unread=LINGER)
            return
        size = int(length)
        if size > self.server.limits.max_body:
            event(logging.WARNING, "request-too-large", client=self.client_address[0],
                  bytes=size, limit=self.server.limits.max_body)
            self._json(413, {"error": f"request body over {self.server.limits.max_body} "
                                      "bytes"}, unread=size)
            return
        body = self.rfile.read(size)
        if len(body) != size:
            event(logging.WARNING, "request-truncated", client=self.client_address[0],
                  got=len(body), expected=size)
            return
        selected = ROUTES.get(self.path.split("?", 1)[0])
        if selected is None:
            self._send(404, b"not found\n", "text/plain")
            return
        outcome = admit(body, selected, self.server.options)
        self._json(outcome.status, outcome.body)
        level = logging.INFO if outcome.status == 200 else logging.WARNING
        event(level, "review", path=self.path, status=outcome.status,
              ms=round((time.monotonic() - started) * 1000, 2), **outcome.fields)

    def _json(self, status: int, doc: dict, unread: int = 0) -> None:
        self._send(status, json.dumps(doc).encode(), "application/json", unread)

    def _send(self, status: int, body: bytes, ctype: str, unread: int = 0) -> None:
        self.send_response_only(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True
        if unread:
            self._linger(unread)

    def _linger(self, unread: int) -> None:
        """Read and drop what the client is still sending, up to LINGER bytes and
        LINGER_SECONDS: a socket closed with unread input is reset, and the reset can
        overtake the answer on its way, so the client would never see why it was refused."""
        self.connection.settimeout(LINGER_SECONDS)
        left = min(unread, LINGER)
        with contextlib.suppress(OSError):
            while left > 0:
                chunk = self.rfile.read1(min(left, 65536))
                if not chunk:
                    break
                left -= len(chunk)

    def log_message(self, format: str, *args: Any) -> None:
        # http.server's own lines (bad request lines, oversized headers) as events too.
        event(logging.DEBUG, "http", client=self.client_address[0],
              message=(format % args)[:200])

    def log_error(self, format: str, *args: Any) -> None:
        event(logging.WARNING, "http-error", client=self.client_address[0],
              message=(format % args)[:200])


def serve(address: tuple[str, int], certificate: Certificate, options: Options,
          limits: Limits) -> WebhookServer:
    """A started server (its loop in a thread of its own); stop() it."""
    server = WebhookServer(address, certificate, options, limits)
    thread = threading.Thread(target=server.serve_forever, name="webhook", daemon=True)
    thread.start()
    event(logging.INFO, "listening", address=f"{server.server_address[0]}:"
          f"{server.server_address[1]}", files=[f.name for f in options.files],
          source=options.source, userns_pods=options.userns_pods,
          seccomp_profile=options.seccomp_profile or None)
    return server


def stop(server: WebhookServer) -> None:
    server.stopping.set()
    server.shutdown()
    server.server_close()
