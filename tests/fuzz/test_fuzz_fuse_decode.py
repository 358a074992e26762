"""Hostile /dev/fuse frames: the decoder never raises and never returns more than the
frame held, and the session answers every frame that takes a reply with exactly one
well-formed reply (or none for FORGET, BATCH_FORGET and INTERRUPT), whatever the lengths,
opcodes, node ids and arguments claim."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from guestfs.fuse import abi
from guestfs.fuse.decode import Malformed, Request, decode
from tests.support.fuseframes import PipeSession, TinyFs, frame, replies
from tests.support.fuzzing import examples

OPCODES = sorted(abi.OPCODE_NAMES) + [0, 7, 19, 54, 4096, 0xFFFFFFFF]


def hostile_frames() -> st.SearchStrategy[bytes]:
    body = st.binary(max_size=600)
    lying = st.one_of(st.none(), st.integers(0, 0xFFFFFFFF))
    built = st.builds(lambda op, b, ln, ext, node, uniq: frame(op, b, nodeid=node, unique=uniq,
                                                              length=ln, extlen=ext),
                      st.sampled_from(OPCODES), body, lying, st.integers(0, 0xFFFF),
                      st.integers(0, (1 << 64) - 1), st.integers(0, (1 << 64) - 1))
    return st.one_of(st.binary(max_size=200), built)


def _size(arg: object) -> int:
    if isinstance(arg, bytes):
        return len(arg)
    if isinstance(arg, tuple):
        return 16 * len(arg)
    return 0


@settings(max_examples=examples(2000), deadline=None)
@given(hostile_frames())
@example(frame(abi.BATCH_FORGET, abi.BATCH_FORGET_IN.pack(0xFFFFFFFF, 0)))
@example(frame(abi.LOOKUP, b"\0" * 0, extlen=0xFFFF))
@example(frame(abi.READ, abi.READ_IN.pack(0, 1 << 63, 0xFFFFFFFF, 0, 0, 0, 0)))
@example(frame(abi.WRITE, abi.WRITE_IN.pack(1, 0, 0xFFFFFFFF, 0, 0, 0, 0) + b"some"))
@example(frame(abi.WRITE, abi.WRITE_IN.pack(1, 1 << 63, 4, 0, 0, 0, 0) + b"some"))
@example(frame(abi.POLL, abi.POLL_IN.pack(1, 2, 0xFFFFFFFF, 0xFFFFFFFF)[:20]))
@example(b"")
def test_decode_never_raises_and_stays_within_the_frame(raw):
    got = decode(raw)
    assert isinstance(got, Request | Malformed)
    if isinstance(got, Request):
        assert abi.IN_HEADER.unpack_from(raw)[0] == len(raw)
        if got.opcode == abi.BATCH_FORGET:
            assert _size(got.arg) <= len(raw)
        if got.opcode == abi.WRITE:
            assert len(got.arg.data) <= len(raw) - abi.IN_HEADER.size - abi.WRITE_IN.size
        if got.opcode == abi.LOOKUP:
            assert 0 < len(got.arg) <= 255 and b"/" not in got.arg and b"\0" not in got.arg
    else:
        assert got.errno > 0


@settings(max_examples=examples(1000), deadline=None)
@given(st.lists(hostile_frames(), min_size=1, max_size=8))
def test_the_session_answers_each_frame_once_and_cleanly(raws):
    s = PipeSession(TinyFs())
    try:
        for raw in raws:
            s.session.handle(raw)
            got = list(replies(s.r))
            req = decode(raw)
            takes_reply = req.reply if isinstance(req, Malformed) else \
                req.opcode not in abi.NO_REPLY
            assert len(got) == (1 if takes_reply else 0)
            for r in got:
                assert r.error <= 0 and (r.error == 0 or r.body == b"")
                assert r.unique == (req.unique if takes_reply else r.unique)
        assert len(s.session.inodes) <= 8        # only what was looked up, and found
    finally:
        s.close()
