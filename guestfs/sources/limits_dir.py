"""The Kubernetes downward API's limits directory (``limits.memory``, ``limits.cpu``),
read for guestfs.engine.explicit, which parses what is found.

A limits-directory file is read defensively: it may be a symlink (the kubelet's atomic
writer makes ``limits.memory -> ..data/limits.memory``) but only to a file inside the
directory; it must be a regular file (a FIFO or /dev/zero is refused without blocking),
at most 4 KiB, UTF-8 text and a quantity. Anything else is an error naming the file, as
a bad option is: serving no limit because a file was unreadable would be silent and wrong.
"""

from __future__ import annotations

import errno
import os
import stat

DOWNWARD_MEMORY_FILE = "limits.memory"
DOWNWARD_CPU_FILE = "limits.cpu"
MAX_LIMIT_FILE = 4096  # a quantity is a few bytes; never read more than this


class LimitFileError(ValueError):
    """A limits-directory file that is there but is not a small text file inside it."""


def read_limits_dir(limits_dir: str) -> dict[str, str] | None:
    """The downward API files present in ``limits_dir`` by name; None when the directory
    does not exist. One that is there but is no directory, or that this process may not
    look into, is a LimitFileError: its limits would be silently lost."""
    try:
        st = os.stat(limits_dir)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise LimitFileError(f"{limits_dir}: cannot look at it: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise LimitFileError(f"{limits_dir}: not a directory; give the directory of the "
                             "downward-API volume (the one holding limits.memory)")
    found = {}
    for name in (DOWNWARD_MEMORY_FILE, DOWNWARD_CPU_FILE):
        text = read_limit_file(limits_dir, name)
        if text is not None:
            found[name] = text
    return found


def read_limit_file(limits_dir: str, name: str) -> str | None:
    """The text of ``limits_dir/name``; None when there is no such file, LimitFileError
    when it is anything but a small UTF-8 regular file inside the directory."""
    path = os.path.join(limits_dir, name)
    try:
        os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as e:     # EACCES: a directory this user may not search
        raise LimitFileError(f"{path}: cannot look at it: {e.strerror} (the directory "
                             "must be readable by guestfs's user)") from None
    real_dir = os.path.realpath(limits_dir)
    real = os.path.realpath(path)
    if os.path.commonpath([real_dir, real]) != real_dir:
        raise LimitFileError(f"{path}: links out of the limits directory (to {real}); "
                                 "refused")
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; O_NOFOLLOW: the path was
        # resolved above, a symlink swapped in since is refused.
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ENOENT:
            return None   # a dangling link: the kubelet has not written the file
        raise LimitFileError(f"{path}: cannot open: {e.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise LimitFileError(f"{path}: not a regular file")
        data = os.read(fd, MAX_LIMIT_FILE + 1)
    except OSError as e:
        raise LimitFileError(f"{path}: cannot read: {e.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_LIMIT_FILE:
        raise LimitFileError(f"{path}: larger than {MAX_LIMIT_FILE} bytes, not a quantity")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise LimitFileError(f"{path}: not UTF-8 text") from None
