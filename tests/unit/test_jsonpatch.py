"""The tests' RFC 6902 applier (tests/support/jsonpatch.py) against the RFC's own examples
(Appendix A), and the webhook's pointers (RFC 6901 escaping) through it."""

from __future__ import annotations

import pytest

from guestfs.webhook import patch
from tests.support.jsonpatch import PatchError, apply, get, tokens

# (document, patch, result) from RFC 6902 Appendix A.
EXAMPLES = [
    ({"foo": "bar"}, [{"op": "add", "path": "/baz", "value": "qux"}],
     {"baz": "qux", "foo": "bar"}),                                             # A.1
    ({"foo": ["bar", "baz"]}, [{"op": "add", "path": "/foo/1", "value": "qux"}],
     {"foo": ["bar", "qux", "baz"]}),                                          # A.2
    ({"baz": "qux", "foo": "bar"}, [{"op": "remove", "path": "/baz"}], {"foo": "bar"}),
    ({"foo": ["bar", "qux", "baz"]}, [{"op": "remove", "path": "/foo/1"}],
     {"foo": ["bar", "baz"]}),                                                 # A.4
    ({"baz": "qux", "foo": "bar"}, [{"op": "replace", "path": "/baz", "value": "boo"}],
     {"baz": "boo", "foo": "bar"}),                                            # A.5
    ({"foo": {"bar": "baz", "waldo": "fred"}, "qux": {"corge": "grault"}},
     [{"op": "move", "from": "/foo/waldo", "path": "/qux/thud"}],
     {"foo": {"bar": "baz"}, "qux": {"corge": "grault", "thud": "fred"}}),     # A.6
    ({"foo": ["all", "grass", "cows", "eat"]},
     [{"op": "move", "from": "/foo/1", "path": "/foo/3"}],
     {"foo": ["all", "cows", "eat", "grass"]}),                                # A.7
    ({"baz": "qux", "foo": ["a", 2, "c"]},
     [{"op": "test", "path": "/baz", "value": "qux"},
      {"op": "test", "path": "/foo/1", "value": 2}],
     {"baz": "qux", "foo": ["a", 2, "c"]}),                                    # A.8
    ({"foo": "bar"}, [{"op": "add", "path": "/child", "value": {"grandchild": {}}}],
     {"foo": "bar", "child": {"grandchild": {}}}),                             # A.10
    ({"/": 9, "~1": 10}, [{"op": "test", "path": "/~01", "value": 10}],
     {"/": 9, "~1": 10}),                                                      # A.14
    ({"foo": ["bar"]}, [{"op": "add", "path": "/foo/-", "value": ["abc", "def"]}],
     {"foo": ["bar", ["abc", "def"]]}),                                        # A.16
]


@pytest.mark.parametrize(("doc", "ops", "want"), EXAMPLES)
def test_rfc6902_examples(doc, ops, want):
    before = repr(doc)
    assert apply(doc, ops) == want
    assert repr(doc) == before            # applied to a copy


@pytest.mark.parametrize(("doc", "ops"), [
    ({"baz": "qux"}, [{"op": "test", "path": "/baz", "value": "bar"}]),           # A.9
    ({"foo": "bar"}, [{"op": "add", "path": "/baz/bat", "value": "qux"}]),        # A.12
    ({"/": 9, "~1": 10}, [{"op": "test", "path": "/~01", "value": "10"}]),        # A.15
    ({"foo": []}, [{"op": "add", "path": "/foo/1", "value": 1}]),
    ({"foo": [1]}, [{"op": "remove", "path": "/foo/-"}]),
    ({"foo": [1]}, [{"op": "add", "path": "/foo/01", "value": 1}]),
    ({}, [{"op": "add", "path": "/spec/volumes/-", "value": 1}]),   # no list to append to
    ({"a": {"b": 1}}, [{"op": "move", "from": "/a", "path": "/a/b/c"}]),
    ({}, [{"op": "frobnicate", "path": "/x"}]),
])
def test_invalid_patches_raise(doc, ops):
    with pytest.raises(PatchError):
        apply(doc, ops)


def test_the_webhooks_pointers_escape_as_rfc6901_says():
    key = "io.guestfs/x~y"
    assert patch.pointer("metadata", "annotations", key) == \
        "/metadata/annotations/io.guestfs~1x~0y"
    assert tokens(patch.pointer("a", key, 0)) == ["a", key, "0"]
    doc = {"metadata": {"annotations": {"team": "a/b"}}}
    out = apply(doc, [patch.add(patch.pointer("metadata", "annotations", key), "v")])
    assert get(out, patch.pointer("metadata", "annotations", key)) == "v"
    assert out["metadata"]["annotations"] == {"team": "a/b", key: "v"}


def test_append_adds_a_missing_list_whole_and_appends_to_an_existing_one():
    assert patch.append({}, "volumes", ("spec", "volumes"), [1, 2]) == \
        [{"op": "add", "path": "/spec/volumes", "value": [1, 2]}]
    assert patch.append({"volumes": None}, "volumes", ("spec", "volumes"), [1]) == \
        [{"op": "add", "path": "/spec/volumes", "value": [1]}]
    assert patch.append({"volumes": [0]}, "volumes", ("spec", "volumes"), [1, 2]) == \
        [{"op": "add", "path": "/spec/volumes/-", "value": 1},
         {"op": "add", "path": "/spec/volumes/-", "value": 2}]
    assert patch.append({}, "volumes", ("spec", "volumes"), []) == []
