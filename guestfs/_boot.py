"""Entry point of the processes guestfs starts from itself (the daemon of `guestfs run`).

It is executed by absolute path with ``python -I``: neither the working directory nor
PYTHON* variables nor the user's site directory are on the import path, and the guestfs
package is loaded from this file's own directory, the very code that started it. A planted
``guestfs/`` or ``guestfs.py`` in the caller's directory is never imported (as root), and an
empty ``guestfs/`` there cannot shadow an editable install.

Usage: python -I /path/to/guestfs/_boot.py ARGS... (ARGS as for the guestfs command).
"""

import importlib.util
import os
import sys


def _load_own_package() -> None:
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
    from guestfs.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
