"""serve_one's rule: every notification gets an answer, whatever fails on our side (an
unanswered one blocks the caller's thread for good)."""

from __future__ import annotations

import pytest

from guestfs.syscalls import notify as sn

NOTE = sn.Notification(id=7, pid=4242, nr=99, arch=0xC000003E, args=(0x1000, 0, 0, 0, 0, 0))


@pytest.fixture
def sent(monkeypatch):
    answers: list[tuple] = []
    monkeypatch.setattr(sn, "respond", lambda fd, nid, val=0, error=0, cont=False:
                        answers.append((nid, val, error, cont)))
    return answers


def test_a_withdrawn_call_is_never_written_and_is_continued(monkeypatch, sent):
    """ID_VALID fails (the caller was killed or took a signal): no copy, and CONTINUE,
    which the kernel refuses for a caller really gone."""
    copies = []
    monkeypatch.setattr(sn, "still_valid", lambda listener, nid: False)
    monkeypatch.setattr(sn.libc, "process_vm_writev", lambda *a: copies.append(a) or 1)
    sn.serve_one(-1, NOTE, {99: lambda note, mem: sn.Answer(int(mem.write(0x1000, b"x")))})
    assert sent == [(7, 0, 0, True)] and copies == []


def test_a_failing_handler_is_continued(monkeypatch, sent):

    def broken(note, mem):
        raise ValueError("bug")
    sn.serve_one(-1, NOTE, {99: broken})
    assert sent == [(7, 0, 0, True)]


def test_an_unknown_syscall_is_continued(sent):
    sn.serve_one(-1, NOTE, {})
    assert sent == [(7, 0, 0, True)]


def test_an_answer_is_sent_as_given(monkeypatch, sent):
    sn.serve_one(-1, NOTE, {99: lambda note, mem: sn.Answer(val=8)})
    assert sent == [(7, 8, 0, False)]
