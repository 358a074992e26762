"""Load the FUSE binding. Only `guestfs mount` imports this: show and explain work where
libfuse is not installed.

The code uses the fusepy API. ``auto`` serves it through guestfs's own FUSE engine
(guestfs/fuse/: the kernel protocol in the standard library, which also holds connections,
pushes invalidations and drops vanished containers' entries); mfusepy on libfuse3 (a
maintained fork of fusepy that drives it), mfusepy on libfuse2 and fusepy are there to be
chosen by name, and taken by ``auto`` only should the engine not load.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from types import ModuleType

from guestfs.daemon.defaults import BINDINGS

SONAMES = {"mfusepy3": "libfuse3.so.3", "mfusepy2": "libfuse.so.2"}
# mfusepy loads FUSE_LIBRARY_PATH as given: one set by the user is left to win, as before.
_USER_LIBRARY_PATH = bool(os.environ.get("FUSE_LIBRARY_PATH"))


@dataclass(frozen=True)
class Binding:
    module: ModuleType
    name: str          # what the startup log says
    libfuse: str
    engine: bool = False   # guestfs's own protocol engine (guestfs/fuse/), no libfuse

    @property
    def takes_fd(self) -> bool:
        """It serves a /dev/fd/N mounted beforehand (the daemon then drops privileges)."""
        return self.engine or "fuse3" in self.libfuse

    @property
    def sees_capabilities(self) -> bool:
        """Its init tells what the kernel's FUSE client offers (the page-cache path)."""
        return self.engine or ("fuse3" in self.libfuse and self.name.startswith("mfusepy"))


class BindingError(RuntimeError):
    pass


def _try(choice: str) -> Binding:
    if choice == "guestfs":
        mod = importlib.import_module("guestfs.fuse.adapter")
        return Binding(mod, "guestfs's FUSE engine", "no libfuse: kernel FUSE protocol",
                       engine=True)
    if choice.startswith("mfusepy"):
        os.environ["FUSE_LIBRARY_NAME"] = "fuse3" if choice == "mfusepy3" else "fuse"
        if not _USER_LIBRARY_PATH:
            # The soname find_library would answer, given to dlopen directly: mfusepy's
            # find_library runs `ldconfig -p` in a child process, at every daemon start.
            # A library that is not installed still fails the import (OSError).
            os.environ["FUSE_LIBRARY_PATH"] = SONAMES[choice]
        mod = importlib.import_module("mfusepy")
        lib = str(getattr(mod, "_libfuse_path", "?"))
        if choice == "mfusepy3" and "fuse3" not in lib:
            raise BindingError(f"mfusepy loaded {lib}, not libfuse3")
        return Binding(mod, f"mfusepy {_version('mfusepy')}", lib)
    mod = importlib.import_module("fuse")
    return Binding(mod, f"fusepy {_version('fusepy')}", str(getattr(mod, "_libfuse_path", "?")))


def _version(dist: str) -> str:
    """The installed version of ``dist`` for the startup log, from its dist-info directory's
    name: importlib.metadata alone would add ~4.6 MiB to a daemon that must stay small (it
    lives in the container's cgroup, docs/mount.md)."""
    import glob  # for libfuse's bindings only: guestfs's engine needs none of it

    for entry in filter(os.path.isabs, sys.path):  # never the working directory ("")
        for info in glob.glob(os.path.join(glob.escape(entry), f"{dist}-*.dist-info")):
            return os.path.basename(info)[len(dist) + 1:-len(".dist-info")]
    return "?"


def load_binding(choice: str = "auto") -> Binding:
    if choice not in BINDINGS:
        raise BindingError(f"unknown FUSE binding {choice!r}; use one of {BINDINGS}")
    order = ["guestfs", "mfusepy3", "mfusepy2", "fusepy"] if choice == "auto" else [choice]
    errors = []
    for c in order:
        try:
            return _try(c)
        except (ImportError, OSError, BindingError) as e:
            errors.append(f"{c}: {e}")
    raise BindingError("no usable FUSE binding (install fuse3/libfuse2 and fusepy or "
                       "mfusepy): " + "; ".join(errors))
