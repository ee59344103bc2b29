"""What the stack's edges make of malformed input: manifests, and pods on their way to the webhook."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_cli.manifests import read_pods
from hami_common.errors import InvalidInput
from hami_common.resources import GPU
from hami_sim.stack._admission import canonical

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


def test_malformed_yaml_is_refused_naming_the_file(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: Pod\nmetadata: {name: [unclosed\n")
    with pytest.raises(InvalidInput, match=r"broken\.yaml"):
        read_pods([broken])


def test_documents_that_are_not_pods_are_skipped(tmp_path: Path) -> None:
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text("kind: Service\n---\n- a list\n---\nkind: Pod\nmetadata: {name: p}\n---\n42\n")
    assert [p["metadata"]["name"] for p in read_pods([mixed])] == ["p"]


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_any_text_is_either_read_or_refused_as_invalid_input(text: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "any.yaml"
        path.write_text(text)
        try:
            pods = read_pods([path])
        except InvalidInput:
            return
        assert all(isinstance(p, dict) for p in pods)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["spec", "metadata", "kind"]), json_values, max_size=3))
def test_canonical_form_never_fails_on_a_malformed_pod(pod: dict[str, Any]) -> None:
    canonical(pod)


def test_canonical_form_writes_quantities_as_strings() -> None:
    pod = {"spec": {"containers": [{"name": "m", "resources": {"limits": {GPU: 1, "cpu": "2"}}}]}}
    assert canonical(pod)["spec"]["containers"][0]["resources"]["limits"] == {GPU: "1", "cpu": "2"}


@pytest.mark.parametrize("containers", [5, "text", None, [1, "x", None], {"a": 1}], ids=repr)
def test_canonical_form_leaves_containers_of_the_wrong_shape_to_the_webhook(containers: object) -> None:
    pod = {"spec": {"containers": containers}}
    assert canonical(pod) == {"spec": {"containers": containers}}
