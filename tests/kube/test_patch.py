"""The emulator's patch and selector rules, as pure functions (RFC 7386 / RFC 6902 examples)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_common.annotations import VGPU_NODE
from hami_common.kube import guarded_annotation_patch, json_patch_body, node_annotation_patch, pod_annotation_patch
from hami_sim.kubeapi import (
    PatchError,
    SelectorError,
    apply_json_patch,
    apply_merge_patch,
    apply_strategic_merge_patch,
    parse_label_selector,
)


@pytest.mark.parametrize(
    ("target", "patch", "expected"),
    [
        pytest.param({"a": "b"}, {"a": "c"}, {"a": "c"}, id="a value replaces a value"),
        pytest.param({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}, id="a new key is added"),
        pytest.param({"a": "b"}, {"a": None}, {}, id="null removes a key"),
        pytest.param({"a": ["b"]}, {"a": "c"}, {"a": "c"}, id="a list is replaced whole"),
        pytest.param({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}, id="maps merge deeply"),
        pytest.param({"e": None}, {"a": 1}, {"e": None, "a": 1}, id="existing nulls stay"),
    ],
)
def test_merge_patch(target: Any, patch: Any, expected: Any) -> None:
    assert apply_merge_patch(target, patch) == expected


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=10,
)


@given(
    target=st.dictionaries(st.text(max_size=3), json_values, max_size=4),
    patch=st.dictionaries(st.text(max_size=3), json_values, max_size=4),
)
def test_merge_patch_is_idempotent(target: dict[str, Any], patch: dict[str, Any]) -> None:
    once = apply_merge_patch(target, patch)
    assert apply_merge_patch(once, patch) == once


@pytest.mark.parametrize(
    ("ops", "expected"),
    [
        pytest.param(
            [{"op": "add", "path": "/baz", "value": "qux"}], {"foo": ["bar", "baz"], "baz": "qux"}, id="add a member"
        ),
        pytest.param(
            [{"op": "add", "path": "/foo/1", "value": "x"}],
            {"foo": ["bar", "x", "baz"]},
            id="add inserts into an array",
        ),
        pytest.param([{"op": "add", "path": "/foo/-", "value": "x"}], {"foo": ["bar", "baz", "x"]}, id="dash appends"),
        pytest.param([{"op": "remove", "path": "/foo/0"}], {"foo": ["baz"]}, id="remove an element"),
        pytest.param([{"op": "move", "from": "/foo/0", "path": "/m"}], {"foo": ["baz"], "m": "bar"}, id="move"),
        pytest.param(
            [{"op": "copy", "from": "/foo", "path": "/c"}], {"foo": ["bar", "baz"], "c": ["bar", "baz"]}, id="copy"
        ),
        pytest.param([{"op": "replace", "path": "/foo", "value": 1}], {"foo": 1}, id="replace"),
    ],
)
def test_json_patch(ops: list[Any], expected: Any) -> None:
    assert apply_json_patch({"foo": ["bar", "baz"]}, ops) == expected


@pytest.mark.parametrize(
    "ops",
    [
        pytest.param([{"op": "test", "path": "/foo", "value": 1}], id="a failed test"),
        pytest.param([{"op": "remove", "path": "/nope"}], id="removing a missing member"),
        pytest.param([{"op": "replace", "path": "/foo/9", "value": 1}], id="an index out of range"),
        pytest.param({"op": "add"}, id="not a list"),
        pytest.param([{"op": "frobnicate", "path": "/foo"}], id="an unknown operation"),
        pytest.param([{"op": "add", "path": "foo", "value": 1}], id="a pointer without a slash"),
    ],
)
def test_json_patch_rejects(ops: Any) -> None:
    with pytest.raises(PatchError):
        apply_json_patch({"foo": ["bar", "baz"]}, ops)


def test_strategic_merge_patch_directives_kubectl_sends() -> None:
    pod = {
        "spec": {"containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "2"}]},
        "metadata": {"finalizers": ["x"], "labels": {"k": "v"}},
    }
    patch = {
        "spec": {"$setElementOrder/containers": [{"name": "b"}], "containers": [{"name": "a", "$patch": "delete"}]},
        "metadata": {"finalizers": ["y"], "labels": {"k": None}},
    }
    result = apply_strategic_merge_patch(pod, patch)
    assert result["spec"]["containers"] == [{"name": "b", "image": "2"}]
    assert result["metadata"] == {"finalizers": ["x", "y"], "labels": {}}


def test_strategic_merge_patch_replace_directive_replaces_a_map() -> None:
    assert apply_strategic_merge_patch({"a": {"x": 1, "y": 2}}, {"a": {"$patch": "replace", "z": 3}}) == {"a": {"z": 3}}


def test_hami_pod_patch_adds_the_vgpu_node_label_and_guards_with_resource_version() -> None:
    patch = pod_annotation_patch({VGPU_NODE: "n1", "example.com/a": None}, resource_version="7")
    assert patch.to_json() == {
        "metadata": {
            "annotations": {VGPU_NODE: "n1", "example.com/a": None},
            "labels": {VGPU_NODE: "n1"},
            "resourceVersion": "7",
        }
    }
    assert node_annotation_patch({"example.com/a": "1"}).to_json() == {
        "metadata": {"annotations": {"example.com/a": "1"}}
    }


def _guarded(read: dict[str, str], **kw: Any) -> list[dict[str, Any]]:
    args: dict[str, Any] = {"uid": "u1", "resource_version": "7", "guards": (), "changes": {}} | kw
    return json_patch_body(guarded_annotation_patch(read, **args))


def test_guarded_patch_tests_the_values_it_read_and_escapes_keys() -> None:
    ops = _guarded({"hami.io/list": "a;b", "x/y~z": "1"}, guards=("hami.io/list",), changes={"hami.io/list": "b"})
    assert ops == [
        {"op": "test", "path": "/metadata/uid", "value": "u1"},
        {"op": "test", "path": "/metadata/annotations/hami.io~1list", "value": "a;b"},
        {"op": "add", "path": "/metadata/annotations/hami.io~1list", "value": "b"},
    ]
    read = {"hami.io/list": "a;b", "x/y~z": "1"}
    patched = apply_json_patch(
        {"metadata": {"uid": "u1", "annotations": read}}, _guarded(read, changes={"x/y~z": None})
    )
    assert patched["metadata"]["annotations"] == {"hami.io/list": "a;b"}


def test_guarded_patch_falls_back_to_the_resource_version_where_absence_cannot_be_tested() -> None:
    rv = {"op": "test", "path": "/metadata/resourceVersion", "value": "7"}
    assert rv in _guarded({"a": "1"}, guards=("b",), changes={"b": "2"})  # a guarded key the copy lacked
    assert rv in _guarded({}, changes={"b": "2"})  # no annotations map: it is added whole
    assert rv in _guarded({"a": "1"}, labels={VGPU_NODE: "n1"})  # no labels map either
    with_labels = _guarded({"a": "1"}, guards=("a",), labels={VGPU_NODE: "n1"}, read_labels={"app": "x"})
    assert rv not in with_labels
    assert {"op": "add", "path": "/metadata/labels/hami.io~1vgpu-node", "value": "n1"} in with_labels
    assert _guarded({"a": "1"}, changes={"gone": None}) == [{"op": "test", "path": "/metadata/uid", "value": "u1"}]


@pytest.mark.parametrize("text", ["a in (b", "a b c", "!a in (b)", "=x"])
def test_malformed_label_selectors_are_rejected(text: str) -> None:
    with pytest.raises(SelectorError):
        parse_label_selector(text)
