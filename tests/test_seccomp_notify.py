"""serve_one's rule: every notification gets an answer, whatever fails on our side (an
unanswered one blocks the caller's thread for good)."""

from __future__ import annotations

import pytest

from guestfs.system import seccomp_notify as sn

NOTE = sn.Notification(id=7, pid=4242, nr=99, arch=0xC000003E, args=(0x1000, 0, 0, 0, 0, 0))


@pytest.fixture
def sent(monkeypatch):
    answers: list[tuple] = []
    monkeypatch.setattr(sn, "respond", lambda fd, nid, val=0, error=0, cont=False:
                        answers.append((nid, val, error, cont)))
    return answers


class _Mem:
    def __init__(self, listener, note):
        self.closed = False

    def close(self):
        self.closed = True


def test_unreachable_caller_memory_is_continued(monkeypatch, sent):
    def refuse(listener, note):
        raise sn.Gone("/proc/4242/mem: Permission denied")
    monkeypatch.setattr(sn, "CallerMemory", refuse)
    sn.serve_one(-1, NOTE, {99: lambda note, mem: sn.Answer(0)})
    assert sent == [(7, 0, 0, True)]


def test_a_failing_handler_is_continued(monkeypatch, sent):
    monkeypatch.setattr(sn, "CallerMemory", _Mem)

    def broken(note, mem):
        raise ValueError("bug")
    sn.serve_one(-1, NOTE, {99: broken})
    assert sent == [(7, 0, 0, True)]


def test_an_unknown_syscall_is_continued(sent):
    sn.serve_one(-1, NOTE, {})
    assert sent == [(7, 0, 0, True)]


def test_an_answer_is_sent_as_given(monkeypatch, sent):
    monkeypatch.setattr(sn, "CallerMemory", _Mem)
    sn.serve_one(-1, NOTE, {99: lambda note, mem: sn.Answer(val=8)})
    assert sent == [(7, 8, 0, False)]
