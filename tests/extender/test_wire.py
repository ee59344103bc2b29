"""The extender's wire JSON and its error conventions (k8s-interfaces §2.1, hami-protocol §4.1, §8 case 27)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_common.errors import InvalidInput
from hami_extender.wire import (
    BindingArgs,
    BindingResult,
    FilterArgsDecoder,
    FilterResult,
    HostPriority,
    RawNodeList,
    decode_binding_args,
    decode_filter_args,
    encode,
)
from hami_sim.kubeapi import KubeApiEmulator
from hami_sim.waiting import eventually
from tests.extender.cluster import add_node, add_pod, cards, gpu_container
from tests.extender.conftest import Served


def golden(shared_fixtures: Path, name: str) -> bytes:
    return (shared_fixtures / "k8s" / f"extender.v1.{name}.golden.json").read_bytes()


def test_filter_args_golden_decodes(shared_fixtures: Path) -> None:
    args = decode_filter_args(golden(shared_fixtures, "ExtenderArgs"))
    assert args.pod is not None
    assert args.pod.metadata.name == "podname"
    assert args.node_names == ["node1"]
    assert [n.metadata.name for n in args.node_objects] == ["nodename"]


def test_filter_result_encodes_as_the_golden_json(shared_fixtures: Path) -> None:
    expected = json.loads(golden(shared_fixtures, "ExtenderFilterResult"))
    items = [msgspec.Raw(json.dumps(item).encode()) for item in expected["Nodes"]["items"]]
    result = FilterResult(
        nodes=RawNodeList(items=items),
        node_names=["node1"],
        failed_nodes={"foo": "bar"},
        failed_and_unresolvable_nodes={"baz": "qux"},
        error="myerror",
    )
    assert json.loads(encode(result)) == expected


def test_binding_json_matches_the_golden_files(shared_fixtures: Path) -> None:
    args = decode_binding_args(golden(shared_fixtures, "ExtenderBindingArgs"))
    assert args == BindingArgs(pod_name="mypodname", pod_namespace="mypodnamespace", pod_uid="mypoduid", node="mynode")
    assert json.loads(encode(BindingResult(error="myerror"))) == json.loads(
        golden(shared_fixtures, "ExtenderBindingResult")
    )
    assert json.loads(encode([HostPriority(host="myhost", score=1)])) == [
        json.loads(golden(shared_fixtures, "HostPriority"))
    ]


def test_an_empty_result_still_writes_every_field_with_null() -> None:
    assert encode(FilterResult(node_names=["n"])) == (
        b'{"Nodes":null,"NodeNames":["n"],"FailedNodes":null,"FailedAndUnresolvableNodes":null,"Error":""}'
    )


def test_keys_are_matched_case_insensitively_like_go() -> None:
    args = decode_filter_args(b'{"pod":{"metadata":{"name":"p"}},"nodenames":["a"],"nodes":null}')
    assert args.node_names == ["a"]
    assert decode_binding_args(b'{"podname":"p","podnamespace":"ns","poduid":"u","node":"n"}').node == "n"


def test_args_without_a_pod_are_refused_with_hamis_message() -> None:
    with pytest.raises(InvalidInput, match="extender args missing pod"):
        decode_filter_args(b'{"NodeNames":["node1"]}')


@given(st.binary(max_size=200))
def test_filter_decoder_answers_any_bytes_with_args_or_invalid_input(body: bytes) -> None:
    with contextlib.suppress(InvalidInput):
        decode_filter_args(body)


@given(st.lists(st.none() | st.lists(st.sampled_from(["a", "b", "c", "d"]), max_size=4), max_size=6))
def test_a_reused_decoder_reads_node_names_as_a_fresh_one_does(lists: list[list[str] | None]) -> None:
    shared = FilterArgsDecoder()
    for names in lists:
        body = json.dumps({"Pod": {"metadata": {"name": "p"}}, "NodeNames": names}).encode()
        args = shared.decode(body)
        assert args.node_names == decode_filter_args(body).node_names == names
        assert args.wanted == frozenset(names or ())


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids, max_size=3),
        max_leaves=10,
    )
)
def test_filter_decoder_answers_any_json_with_args_or_invalid_input(value: object) -> None:
    for body in (json.dumps(value).encode(), json.dumps({"Pod": value, "NodeNames": value}).encode()):
        with contextlib.suppress(InvalidInput):
            decode_filter_args(body)


DEEP = 100_000
MALFORMED = [
    pytest.param(b"{not json", "decode extender args", id="bad JSON"),
    pytest.param(b'{"NodeNames":["node1"]}', "extender args missing pod", id="no pod"),
    pytest.param(b'{"Pod":null,"NodeNames":["node1"]}', "extender args missing pod", id="a null pod"),
    pytest.param(b"[1,2,3]", "decode extender args", id="an array instead of an object"),
    pytest.param(b'{"Pod":{"spec":{"containers":"x"}}}', "decode extender args", id="a pod of the wrong shape"),
    pytest.param(b'{"Pod":{}, "NodeNames":' + b'"x" ' * (1 << 19) + b"}", "EOF", id="a body over 1 MiB"),
    # 100,000 levels: past any recursion limit a library might have raised (Python's default is 1,000)
    pytest.param(b'{"x":' + b"[" * DEEP + b"]" * DEEP + b"}", "recursion", id="JSON nested 100,000 deep"),
    pytest.param(b'{"Pod":{"metadata":{"x":' + b"[" * DEEP + b"]" * DEEP + b"}}}", "recursion", id="a pod nested deep"),
]


@pytest.mark.parametrize(("body", "error"), MALFORMED)
async def test_malformed_filter_args_get_200_with_error_and_the_server_keeps_serving(
    extender: Served, body: bytes, error: str
) -> None:
    response = await extender.client.post("/filter", content=body)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert error in response.json()["Error"]
    assert (await extender.client.get("/healthz")).status_code == 200


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b'{"PodName": 7}', id="a field of the wrong type"),
        pytest.param(b'{"PodName":"p","Node":' + b"[" * DEEP + b"]" * DEEP + b"}", id="JSON nested 100,000 deep"),
    ],
)
async def test_malformed_binding_args_get_200_with_error(extender: Served, body: bytes) -> None:
    response = await extender.client.post("/bind", content=body)
    assert response.status_code == 200
    assert response.json()["Error"].startswith("decode")
    assert (await extender.client.get("/healthz")).status_code == 200


@pytest.mark.parametrize("decode", [decode_filter_args, decode_binding_args])
def test_json_nested_past_the_recursion_limit_is_invalid_input(decode: Callable[[bytes], object]) -> None:
    with pytest.raises(InvalidInput, match="recursion"):
        decode(b'{"Pod":' + b"[" * DEEP + b"]" * DEEP + b', "PodName":"p", "Node":"n"}')


@pytest.mark.parametrize("path", ["/filter", "/bind", "/prioritize"])
async def test_an_empty_body_gets_400_as_hami_answers(extender: Served, path: str) -> None:
    response = await extender.client.post(path, content=b"")
    assert response.status_code == 400
    assert response.text == "Please send a request body"


async def test_unknown_node_names_are_reported_unregistered(emulator: KubeApiEmulator, extender: Served) -> None:
    result = await extender.filter(add_pod(emulator, "p"), ["nowhere", "elsewhere"])
    assert result["FailedNodes"] == {"nowhere": "node unregistered", "elsewhere": "node unregistered"}
    assert result["Error"] == ""


async def test_probes_answer(extender: Served) -> None:
    assert (await extender.client.get("/healthz")).text == ""
    ready = (await extender.client.get("/readyz")).json()
    assert (ready["leader"], ready["identity"], ready["synced"]) == (True, "extender-test", True)


async def test_prioritize_scores_every_node_between_0_and_10(extender: Served) -> None:
    response = await extender.client.post("/prioritize", json={"Pod": {}, "NodeNames": ["a", "b"]})
    assert response.json() == [{"Host": "a", "Score": 0}, {"Host": "b", "Score": 0}]


async def test_the_verbs_answer_only_post(extender: Served) -> None:
    response = await extender.client.get("/filter")
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"
    assert (await extender.client.post("/filter", content=b"")).status_code == 400


async def test_a_node_that_registers_later_is_no_longer_reported_unregistered(
    emulator: KubeApiEmulator, extender: Served
) -> None:
    names = ["node1", "late"]
    add_node(emulator, "node1", cards("node1", n=1, devmem=1000))
    await eventually(lambda: "node1" in extender.state["ledger"])
    big = [gpu_container(mem=2000)]
    first = await extender.filter(add_pod(emulator, "a", containers=big), names)
    assert first["FailedNodes"] == {"late": "node unregistered", "node1": "1/1 CardInsufficientMemory"}
    add_node(emulator, "late")
    await eventually(lambda: "late" in extender.state["ledger"])
    second = await extender.filter(add_pod(emulator, "b", containers=big), names)
    assert (second["NodeNames"], second["FailedNodes"]) == (["late"], None)


async def test_filter_success_sends_failed_nodes_null_as_hami_does(emulator: KubeApiEmulator, extender: Served) -> None:
    add_node(emulator, "node1", cards("node1", n=1, devmem=1000))
    await eventually(lambda: "node1" in extender.state["ledger"])
    pod = add_pod(emulator, "p")
    response = await extender.client.post("/filter", json={"Pod": pod, "Nodes": None, "NodeNames": ["zz", "node1"]})
    assert response.content == (
        b'{"Nodes":null,"NodeNames":["node1"],"FailedNodes":null,"FailedAndUnresolvableNodes":null,"Error":""}'
    )


async def test_failed_nodes_are_written_in_sorted_key_order_as_go_writes_maps(
    emulator: KubeApiEmulator, extender: Served
) -> None:
    add_node(emulator, "m-small", cards("m-small", n=1, devmem=500))
    await eventually(lambda: "m-small" in extender.state["ledger"])
    pod = add_pod(emulator, "p")
    # unregistered names are listed first internally, then fitted nodes: the wire order must not show it
    names = ["zeta", "m-small", "alpha"]
    response = await extender.client.post("/filter", json={"Pod": pod, "Nodes": None, "NodeNames": names})
    failed = response.content.split(b'"FailedNodes":', 1)[1]
    keys = [failed.index(f'"{name}":'.encode()) for name in ("alpha", "m-small", "zeta")]
    assert keys == sorted(keys), response.text
