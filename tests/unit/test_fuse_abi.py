"""guestfs/fuse/abi.py and decode.py against include/uapi/linux/fuse.h: struct sizes as
the header's fields add up (by hand below), packing and unpacking round trips, and the
decoder's checks on frames built by hand."""

from __future__ import annotations

import errno

import pytest

from guestfs.fuse import abi
from guestfs.fuse.decode import GetattrIn, InitIn, Malformed, ReadIn, Request, decode
from tests.support.fuseframes import frame, init_frame


@pytest.mark.parametrize("struct_,size", [
    (abi.IN_HEADER, 4 + 4 + 8 + 8 + 4 + 4 + 4 + 2 + 2),          # 40
    (abi.OUT_HEADER, 4 + 4 + 8),                                  # 16
    (abi.INIT_OUT, 4 * 4 + 2 * 2 + 4 + 4 + 2 * 2 + 4 + 4 + 2 + 2 * 11),   # 64
    (abi.ATTR, 6 * 8 + 10 * 4),                                   # 88
    (abi.ENTRY_OUT_HEAD, 4 * 8 + 2 * 4),                          # + attr = 128
    (abi.ATTR_OUT_HEAD, 8 + 4 + 4),                               # + attr = 104
    (abi.KSTATFS, 5 * 8 + 4 * 4 + 6 * 4),                         # 80
    (abi.READ_IN, 8 + 8 + 4 + 4 + 8 + 4 + 4),                     # 40
    (abi.OPEN_OUT, 8 + 4 + 4),
    (abi.DIRENT_HEAD, 8 + 8 + 4 + 4),
    (abi.NOTIFY_INVAL_INODE_OUT, 3 * 8),
    (abi.GETATTR_IN, 4 + 4 + 8),
    (abi.RELEASE_IN, 8 + 4 + 4 + 8),
    (abi.FORGET_ONE, 16),
])
def test_struct_sizes_are_the_headers(struct_, size):
    assert struct_.size == size


def test_entry_and_attr_replies_are_the_kernels_sizes():
    attr = abi.Attr(0o100444, size=10)
    assert len(abi.entry_out(5, attr, 0.5, 0.0)) == 128
    assert len(abi.attr_out(5, attr, 0.0)) == 104


@pytest.mark.parametrize("attr", [
    abi.Attr(0o100444, size=4096, nlink=1, mtime_ns=1_700_000_000_123_456_789,
             ctime_ns=5, atime_ns=10**9, uid=1000, gid=100, blocks=8, blksize=4096),
    abi.Attr(0o40555, nlink=2),
    abi.Attr(0o100444, size=(1 << 64) - 1, mtime_ns=(1 << 63)),
])
def test_attr_round_trip(attr):
    ino, back = abi.unpack_attr(abi.pack_attr(attr, 77))
    assert ino == 77 and back == attr


def test_timeouts_split_into_seconds_and_nanoseconds():
    assert abi.split_timeout(0.5) == (0, 500_000_000)
    assert abi.split_timeout(1.25) == (1, 250_000_000)
    assert abi.split_timeout(0.01) == (0, 10_000_000)
    assert abi.split_timeout(-1) == (0, 0)
    head = abi.ENTRY_OUT_HEAD.unpack_from(abi.entry_out(9, abi.Attr(0o40555), 0.5, 0.01))
    assert head == (9, 0, 0, 0, 500_000_000, 10_000_000)


def test_dirents_are_padded_to_eight_bytes():
    rec = abi.dirent(3, 1, b"meminfo", 8)
    assert len(rec) == 32          # 24 + 7, rounded up
    assert abi.DIRENT_HEAD.unpack_from(rec) == (3, 1, 7, 8)
    assert rec[24:31] == b"meminfo" and rec[31:] == b"\0"
    assert len(abi.dirent(3, 1, b"12345678", 4)) == 32   # already aligned: no padding


def test_opcode_names():
    assert abi.opcode_name(abi.LOOKUP) == "LOOKUP"
    assert abi.opcode_name(abi.COPY_FILE_RANGE_64) == "COPY_FILE_RANGE_64"
    assert abi.opcode_name(4096) == "opcode 4096"


def test_header_fields_decode():
    req = decode(frame(abi.GETATTR, abi.GETATTR_IN.pack(abi.GETATTR_FH, 0, 99), nodeid=5,
                       unique=123, pid=77, uid=1, gid=2))
    assert req == Request(abi.GETATTR, 123, 5, 1, 2, 77, GetattrIn(abi.GETATTR_FH, 99))


def test_init_with_flags2():
    req = decode(init_frame(minor=44, flags=abi.INIT_EXT | abi.ASYNC_READ | abi.ALLOW_IDMAP))
    assert isinstance(req, Request)
    assert req.arg == InitIn(7, 44, 131072, abi.INIT_EXT | abi.ASYNC_READ | abi.ALLOW_IDMAP)


def test_init_before_7_36_has_no_flags2():
    # flags2's bits are read only with INIT_EXT, from a body that has them.
    req = decode(init_frame(minor=31, flags=abi.ASYNC_READ))
    assert req.arg == InitIn(7, 31, 131072, abi.ASYNC_READ)


def test_read_decodes_and_is_bounded_by_the_negotiated_size():
    body = abi.READ_IN.pack(4, 8192, 4096, abi.READ_LOCKOWNER, 0xABC, 0o100000, 0)
    assert decode(frame(abi.READ, body)).arg == ReadIn(4, 8192, 4096, abi.READ_LOCKOWNER,
                                                         0xABC, 0o100000)
    big = abi.READ_IN.pack(4, 0, 1 << 30, 0, 0, 0, 0)
    assert decode(frame(abi.READ, big), max_read=1 << 20).errno == errno.EINVAL


@pytest.mark.parametrize("raw,err,reply", [
    (b"", errno.EIO, False),                                          # nothing
    (b"\x01" * 20, errno.EIO, True),                                  # a unique, no header
    (frame(abi.GETATTR, abi.GETATTR_IN.pack(0, 0, 0), length=200), errno.EIO, True),  # lies
    (frame(abi.GETATTR, abi.GETATTR_IN.pack(0, 0, 0), length=41), errno.EIO, True),
    (frame(abi.GETATTR, b"\0" * 8), errno.EINVAL, True),              # truncated argument
    (frame(9999), errno.ENOSYS, True),                                # unknown opcode
    (frame(abi.LOOKUP, b"abc"), errno.EINVAL, True),                  # no NUL
    (frame(abi.LOOKUP, b"\0"), errno.EINVAL, True),                   # empty name
    (frame(abi.LOOKUP, b"a/b\0"), errno.EINVAL, True),
    (frame(abi.LOOKUP, b"x" * 300 + b"\0"), errno.ENAMETOOLONG, True),
    (frame(abi.FORGET, b"\0" * 4), errno.EINVAL, False),              # no reply to FORGET
    (frame(abi.GETATTR, abi.GETATTR_IN.pack(0, 0, 0), extlen=3), errno.EINVAL, True),
])
def test_malformed_frames(raw, err, reply):
    got = decode(raw)
    assert isinstance(got, Malformed)
    assert (got.errno, got.reply) == (err, reply)


def test_extensions_are_cut_off_the_argument():
    body = b"name\0" + b"\xff" * 16       # a name, then 16 bytes of extension
    assert decode(frame(abi.LOOKUP, body, extlen=2)).arg == b"name"


def test_batch_forget_count_is_cut_to_the_frame():
    ones = abi.FORGET_ONE.pack(5, 1) + abi.FORGET_ONE.pack(6, 2)
    req = decode(frame(abi.BATCH_FORGET, abi.BATCH_FORGET_IN.pack(1_000_000, 0) + ones))
    assert req.arg == ((5, 1), (6, 2))
    req = decode(frame(abi.BATCH_FORGET, abi.BATCH_FORGET_IN.pack(1, 0) + ones))
    assert req.arg == ((5, 1),)
