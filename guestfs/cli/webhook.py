"""`guestfs webhook`: the mutating admission webhook that gives the pods it selects the
node DaemonSet's per-caller files (guestfs/webhook/)."""

from __future__ import annotations

import argparse
import signal
import threading
from typing import Any

from guestfs.cli.options import CliError, seconds
from guestfs.webhook.files import (
    DEFAULT_FILES,
    DEFAULT_SECCOMP_PROFILE,
    DEFAULT_SOURCE,
)

DEFAULT_MAX_BODY = 3 << 20       # the API server's own request limit (3 MiB)
DEFAULT_TIMEOUT = 10.0           # the API server's default webhook timeout
DEFAULT_MAX_CONNECTIONS = 128


def add_parser(sub: Any) -> None:
    p = sub.add_parser("webhook", help="a Kubernetes mutating admission webhook that adds "
                                       "the node's guestfs files to selected pods",
                       description="Serve AdmissionReview v1 over HTTPS: POST /mutate for "
                                   "namespaces the configuration selects (a pod annotated "
                                   "io.guestfs.enable=false is skipped), POST "
                                   "/mutate/annotated for the others (only pods annotated "
                                   "io.guestfs.enable=true), GET /healthz and /readyz. "
                                   "Selected pods get the DaemonSet's per-caller files as "
                                   "read-only hostPath mounts in every container "
                                   "(docs/deploy.md). SIGTERM stops it.")
    p.add_argument("--listen", required=True, metavar="ADDR:PORT",
                   help="the address to serve on (0.0.0.0:8443, [::]:8443)")
    p.add_argument("--tls-cert", required=True, metavar="FILE",
                   help="the server certificate (PEM, with its chain); reloaded when it "
                        "changes")
    p.add_argument("--tls-key", required=True, metavar="FILE",
                   help="the certificate's private key (PEM); reloaded when it changes")
    p.add_argument("--files", default=",".join(DEFAULT_FILES), metavar="LIST",
                   help="comma-separated files to inject (default "
                        f"{','.join(DEFAULT_FILES)}; possible and present may be added; "
                        "the pressure files are refused: runc forbids binds over them)")
    p.add_argument("--source", default=DEFAULT_SOURCE, metavar="DIR",
                   help=f"the nodes' per-caller guestfs mount (default {DEFAULT_SOURCE})")
    p.add_argument("--userns-pods", action="store_true",
                   help="also inject into hostUsers: false pods (only where the nodes' "
                        "guestfs files allow idmapped binds); otherwise they are skipped "
                        "with a warning")
    p.add_argument("--seccomp", action="store_true",
                   help="also set the pod's seccompProfile to the Localhost profile "
                        "--seccomp-profile (sysinfo(2) and the CPU count from the node's "
                        "seccomp agent) where the pod has none")
    p.add_argument("--seccomp-profile", default=DEFAULT_SECCOMP_PROFILE, metavar="NAME",
                   help="the profile's name below kubelet's seccomp directory (default "
                        f"{DEFAULT_SECCOMP_PROFILE})")
    p.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_BODY, metavar="N",
                   help=f"refuse a larger request body (default {DEFAULT_MAX_BODY})")
    p.add_argument("--request-timeout", type=seconds(0, strict=True), default=DEFAULT_TIMEOUT,
                   metavar="S", help="cut a connection not answered within S seconds, TLS "
                                     f"handshake included (default {DEFAULT_TIMEOUT:g})")
    p.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS,
                   metavar="N", help="close connections beyond N at once (default "
                                     f"{DEFAULT_MAX_CONNECTIONS})")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.set_defaults(func=command)


def listen_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535 or not host:
        raise CliError(f"webhook: --listen {text!r}: give ADDR:PORT (0.0.0.0:8443, "
                       "[::]:8443)")
    return host.strip("[]"), int(port)


def command(args: argparse.Namespace) -> int:
    import logging
    import ssl

    from guestfs.webhook import server
    from guestfs.webhook.events import event, setup_logging
    from guestfs.webhook.files import choose
    from guestfs.webhook.inject import Options

    address = listen_address(args.listen)
    try:
        files = choose([w.strip() for w in args.files.split(",") if w.strip()])
    except ValueError as e:
        raise CliError(f"webhook: --files: {e}") from None
    if args.max_request_bytes < 1 or args.max_connections < 1:
        raise CliError("webhook: --max-request-bytes and --max-connections must be >= 1")
    setup_logging(args.verbose)
    options = Options(files=files, source=args.source, userns_pods=args.userns_pods,
                      seccomp_profile=args.seccomp_profile if args.seccomp else "")
    limits = server.Limits(args.max_request_bytes, args.request_timeout,
                           args.max_connections)
    try:
        certificate = server.Certificate(args.tls_cert, args.tls_key)
        running = server.serve(address, certificate, options, limits)
    except (OSError, ssl.SSLError) as e:
        raise CliError(f"webhook: {e}") from None
    stopped = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopped.set())
    stopped.wait()
    event(logging.INFO, "stopping")
    server.stop(running)
    return 0
