"""What the stack's edges make of malformed input: manifests. (Pods go to the apiserver as read; it decodes
them, quantities as strings, before its webhooks see them.)"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_cli.manifests import read_pods
from hami_common.errors import InvalidInput


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
