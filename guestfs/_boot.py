"""Entry point of the processes guestfs starts from itself (the daemon of `guestfs run`).

It is executed by absolute path with ``python -I``: neither the working directory nor
PYTHON* variables nor the user's site directory are on the import path, and the guestfs
package is loaded from this file's own directory, the very code that started it. A planted
``guestfs/`` or ``guestfs.py`` in the caller's directory is never imported (as root), and an
empty ``guestfs/`` there cannot shadow an editable install.

Usage: python -I /path/to/guestfs/_boot.py [--exit-with-fd FD] ARGS... (ARGS as for the
guestfs command). With --exit-with-fd, FD is the read end of a pipe whose write end the
parent keeps: end of file there means the parent is gone (even by kill -9), and this
process then stops itself with SIGTERM, on which a serving daemon unmounts.
"""

import importlib.util
import os
import signal
import sys
import threading


def _load_own_package() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location(
        "guestfs", os.path.join(here, "__init__.py"), submodule_search_locations=[here])
    if spec is None or spec.loader is None:
        raise SystemExit(f"guestfs: cannot load the package from {here}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["guestfs"] = module
    spec.loader.exec_module(module)


def _exit_with(fd: int) -> None:
    """SIGTERM to ourselves once every write end of ``fd``'s pipe is closed. A pipe, not
    PR_SET_PDEATHSIG: that follows the parent *thread* that forked us, and a supervisor may
    start daemons from a thread that ends before the parent does."""
    def watch() -> None:
        while True:
            try:
                if not os.read(fd, 64):
                    break
            except InterruptedError:
                continue
            except OSError:
                break
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="guestfs-parent-watch", daemon=True).start()


def main(argv: list[str]) -> int:
    if argv[:1] == ["--exit-with-fd"]:
        fd = argv[1] if len(argv) > 1 else ""
        if not fd.isdigit():
            print(f"guestfs: --exit-with-fd {fd!r}: not a file descriptor", file=sys.stderr)
            return 2
        _exit_with(int(fd))
        argv = argv[2:]
    _load_own_package()
    from guestfs.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
