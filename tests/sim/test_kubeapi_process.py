"""The API emulator in a child process: the same state across restarts, commands answered, no orphan child."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from hami_sim.kubeapi import KubeApiProcess

NODE: dict[str, Any] = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-node-0"}}


def _get(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_seeded_objects_are_served_and_survive_a_restart_on_the_same_port(tmp_path: Path) -> None:
    with KubeApiProcess() as api:
        stored = api.create("", "v1", "nodes", None, NODE)
        port = api.port
        assert stored["metadata"]["uid"]
        assert _get(f"{api.url}/api/v1/nodes/gpu-node-0")[1]["metadata"]["uid"] == stored["metadata"]["uid"]
        api.restart()
        assert api.port == port
        status, node = _get(f"{api.url}/api/v1/nodes/gpu-node-0")
        assert (status, node["metadata"]["uid"]) == (200, stored["metadata"]["uid"])
        assert api.count("GET", "/api/v1/nodes/gpu-node-0") == 2
        config = json.loads(api.write_kubeconfig(tmp_path / "kubeconfig").read_text())
        assert config["clusters"][0]["cluster"]["server"] == api.url


def test_compaction_makes_an_old_resource_version_gone() -> None:
    with KubeApiProcess() as api:
        first = api.create("", "v1", "nodes", None, NODE)
        api.create("", "v1", "nodes", None, {**NODE, "metadata": {"name": "gpu-node-1"}})
        assert api.compact() > 0
        rv = first["metadata"]["resourceVersion"]
        with urllib.request.urlopen(f"{api.url}/api/v1/nodes?watch=1&resourceVersion={rv}", timeout=10) as reply:
            event = json.loads(reply.readline())
        assert (event["type"], event["object"]["code"]) == ("ERROR", 410)


def test_a_refused_command_is_an_error_and_the_child_keeps_serving() -> None:
    with KubeApiProcess() as api:
        api.create("", "v1", "nodes", None, NODE)
        with pytest.raises(RuntimeError, match="already exists"):
            api.create("", "v1", "nodes", None, NODE)
        with pytest.raises(RuntimeError, match="unknown resource"):
            api.create("", "v1", "gadgets", None, NODE)
        assert _get(f"{api.url}/api/v1/nodes")[0] == 200


def test_closing_ends_the_child_and_frees_the_port() -> None:
    api = KubeApiProcess().start()
    url = api.url
    child = api._child
    api.close()
    assert child is not None
    assert child.poll() is not None
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"{url}/api/v1/nodes", timeout=2)


def test_a_malformed_command_line_gets_an_error_answer() -> None:
    with KubeApiProcess() as api:
        child = api._child
        assert child is not None
        assert child.stdin is not None
        assert child.stdout is not None
        for garbage in (b"not json\n", b'{"op": "explode"}\n'):
            child.stdin.write(garbage)
            child.stdin.flush()
            answer = json.loads(child.stdout.readline())
            assert answer["ok"] is False
            assert "malformed command" in answer["error"]
        assert _get(f"{api.url}/api/v1/nodes")[0] == 200
