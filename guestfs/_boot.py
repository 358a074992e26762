"""Entry point of the processes guestfs starts from itself (the daemon of `guestfs run`).

It is executed by absolute path with ``python -I``: neither the working directory nor
PYTHON* variables nor the user's site directory are on the import path, and the guestfs
package is loaded from this file's own directory, the very code that started it. A planted
``guestfs/`` or ``guestfs.py`` in the caller's directory is never imported (as root), and an
empty ``guestfs/`` there cannot shadow an editable install.

Usage: python -I /path/to/guestfs/_boot.py ARGS... (ARGS as for the guestfs command).

The daemon's unmount watcher (guestfs.daemon.privileges) runs it as
``python -I -S _boot.py --unmount-watcher FD MOUNTPOINT``: it waits on FD with nothing
but os and sys imported, since its memory counts in the daemon's container, and loads the
package only to unmount. The seccomp guard runs it as ``python -I -S _boot.py
--seccomp-guard FD [KEEPER_FD] [--then-answer MOUNTPOINT CALLS]`` (or ``--seccomp-keeper
KEEPER_FD``) for the same reason (guestfs.syscalls.guard), and starts the successor
of a `guestfs run` that is gone as ``--seccomp-successor FD MOUNTPOINT CALLS``. A
``guestfs mount --hold`` starts the holder of its FUSE connection as ``--fuse-holder
CTL FUSE LOCK MOUNTPOINT SOCKET -- ARGV...`` (guestfs.fuse.holder); `guestfs fuse-holder`
executes ``--fuse-holder-standalone LOCK_DIR [SECONDS]``.
"""

import os
import sys

UNMOUNT_WATCHER = "--unmount-watcher"  # as guestfs.system.selfexec.UNMOUNT_WATCHER
SECCOMP_GUARD = "--seccomp-guard"      # as guestfs.system.selfexec.SECCOMP_GUARD
SECCOMP_KEEPER = "--seccomp-keeper"    # as guestfs.system.selfexec.SECCOMP_KEEPER
SECCOMP_SUCCESSOR = "--seccomp-successor"  # as guestfs.system.selfexec.SECCOMP_SUCCESSOR
THEN_ANSWER = "--then-answer"          # as guestfs.system.selfexec.THEN_ANSWER
FUSE_HOLDER = "--fuse-holder"          # as guestfs.system.selfexec.FUSE_HOLDER
FUSE_HOLDER_STANDALONE = "--fuse-holder-standalone"   # as guestfs.system.selfexec's


def _load_own_package() -> None:
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location(
        "guestfs", os.path.join(here, "__init__.py"), submodule_search_locations=[here])
    if spec is None or spec.loader is None:
        raise SystemExit(f"guestfs: cannot load the package from {here}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["guestfs"] = module
    spec.loader.exec_module(module)


def main(argv: list[str]) -> int:
    _load_own_package()
    from guestfs.cli.main import main as cli_main

    return cli_main(argv)


def unmount_watcher(fd: str, mountpoint: str) -> int:
    """b"u" on ``fd``: the server stopped cleanly, detach its mount. EOF without it: the
    server was killed, and the stale mount is left for the next start to detach. The
    server set SIGINT, SIGTERM, SIGHUP and SIGQUIT to be ignored before the exec."""
    if os.read(int(fd), 1) != b"u":
        return 0
    _load_own_package()
    from guestfs.daemon.privileges import detach

    detach(mountpoint)
    return 0


def seccomp_guard(sock_fd: str, keeper_fd: str | None = None, stay: bool = False,
                  successor: tuple[str, str] | None = None) -> int:
    """The guard of seccomp listeners (guestfs.syscalls.guard): ignores the signals
    a terminal or a process-group kill sends, then loads the package and keeps every
    listener it is handed until no supervisor is attached and their processes have
    exited. ``keeper_fd``: a listening socket on which a later agent takes them back.
    ``stay`` (--seccomp-keeper KEEPER_FD, the standalone guard of `guestfs seccomp-guard`,
    a container's main process): no first supervisor, and it never exits on its own.
    ``successor``: the mountpoint and calls a successor answers from once the supervisor
    is gone (``--then-answer MOUNTPOINT CALLS``)."""
    _ignore_stop_signals()
    _load_own_package()
    from guestfs.syscalls.guard import guard_main

    guard_main(None if stay else int(sock_fd),
               int(keeper_fd) if keeper_fd is not None else None, stay, successor)
    return 0


def seccomp_successor(sock_fd: str, mountpoint: str, calls: str) -> int:
    """The answers of a `guestfs run` that is gone, for its app (started by its guard):
    the listeners come over ``sock_fd`` as a keeper hands them back."""
    _ignore_stop_signals()
    _load_own_package()
    from guestfs.syscalls.successor import serve_handed_over

    return serve_handed_over(int(sock_fd), mountpoint, calls)


def fuse_holder(args: list[str], standalone: bool = False) -> int:
    """The holder of a FUSE connection (guestfs.fuse.holder), or of many handed over
    (``standalone``: `guestfs fuse-holder`): of the package, only its own module and the
    message format are loaded."""
    _load_own_package()
    from guestfs.fuse.holder import holder_main, standalone_main

    return standalone_main(args) if standalone else holder_main(args)


def _ignore_stop_signals() -> None:
    """What a terminal or a process-group kill sends is not for these keepers."""
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)


def _guard_args(args: list[str]) -> tuple[list[str], tuple[str, str] | None]:
    """FD [KEEPER_FD] [--then-answer MOUNTPOINT CALLS]."""
    if THEN_ANSWER in args:
        at = args.index(THEN_ANSWER)
        if len(args) != at + 3:
            raise SystemExit(f"guestfs: {THEN_ANSWER} takes MOUNTPOINT CALLS")
        return args[:at], (args[at + 1], args[at + 2])
    return args, None


if __name__ == "__main__":
    if sys.argv[1:2] == [SECCOMP_GUARD]:
        fds, then = _guard_args(sys.argv[2:])
        raise SystemExit(seccomp_guard(*fds[:2], successor=then))
    if sys.argv[1:2] == [SECCOMP_SUCCESSOR] and len(sys.argv) == 5:
        raise SystemExit(seccomp_successor(*sys.argv[2:5]))
    if sys.argv[1:2] == [SECCOMP_KEEPER]:
        raise SystemExit(seccomp_guard("", sys.argv[2], stay=True))
    if sys.argv[1:2] == [FUSE_HOLDER]:
        raise SystemExit(fuse_holder(sys.argv[2:]))
    if sys.argv[1:2] == [FUSE_HOLDER_STANDALONE]:
        raise SystemExit(fuse_holder(sys.argv[2:], standalone=True))
    if sys.argv[1:2] == [UNMOUNT_WATCHER]:
        raise SystemExit(unmount_watcher(*sys.argv[2:4]))
    raise SystemExit(main(sys.argv[1:]))
