"""The scheduler-extender wire JSON (k8s.io/kube-scheduler/extender/v1; k8s-interfaces §2.1).

Go writes the struct field names as they are (``NodeNames``, ``FailedNodes``, ``PodUID``) and emits every
field, ``null`` where unset; its decoder matches keys case-insensitively. Responses here are encoded with
the exact names; requests are decoded whatever the case of their top-level keys.
"""

from __future__ import annotations

from typing import Final, TypeVar

import msgspec

from hami_common.errors import InvalidInput
from hami_common.kube import Container, Node, ObjectMeta, Pod, PodSpec

__all__ = [
    "MAX_BODY",
    "BindingArgs",
    "BindingResult",
    "FilterArgs",
    "FilterArgsDecoder",
    "FilterResult",
    "HostPriority",
    "MetaPod",
    "MetaVictims",
    "PreemptionArgs",
    "PreemptionResult",
    "RawNodeList",
    "decode_binding_args",
    "decode_filter_args",
    "decode_preemption_args",
    "encode",
]

MAX_BODY: Final = 1 << 20  # HAMi reads bodies through a 1 MiB LimitReader


class RawNodeList(msgspec.Struct, frozen=True, kw_only=True):
    """A v1.NodeList whose items stay raw JSON, so a chosen node is echoed back unchanged."""

    metadata: dict[str, object] = msgspec.field(default_factory=dict)
    items: list[msgspec.Raw] = msgspec.field(default_factory=list)


class FilterResult(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    rename={
        "nodes": "Nodes",
        "node_names": "NodeNames",
        "failed_nodes": "FailedNodes",
        "failed_and_unresolvable_nodes": "FailedAndUnresolvableNodes",
        "error": "Error",
    },
):
    """``ExtenderFilterResult``; every field is written, ``null`` where unset."""

    nodes: RawNodeList | None = None
    node_names: list[str] | None = None
    failed_nodes: dict[str, str] | None = None
    failed_and_unresolvable_nodes: dict[str, str] | None = None
    error: str = ""


class BindingArgs(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    rename={"pod_name": "PodName", "pod_namespace": "PodNamespace", "pod_uid": "PodUID", "node": "Node"},
):
    pod_name: str = ""
    pod_namespace: str = ""
    pod_uid: str = ""
    node: str = ""


class BindingResult(msgspec.Struct, frozen=True, kw_only=True, rename={"error": "Error"}):
    error: str = ""


class HostPriority(msgspec.Struct, frozen=True, kw_only=True, rename={"host": "Host", "score": "Score"}):
    host: str
    score: int


class _WireSpec(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The pod spec fields the extender reads; Go writes empty lists as ``null``."""

    node_name: str | None = None
    scheduler_name: str | None = None
    priority: int | None = None
    containers: tuple[Container, ...] | None = None
    init_containers: tuple[Container, ...] | None = None


class _WirePod(msgspec.Struct, frozen=True, kw_only=True):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: _WireSpec = msgspec.field(default_factory=_WireSpec)

    def to_pod(self) -> Pod:
        s = self.spec
        return Pod(
            metadata=self.metadata,
            spec=PodSpec(
                node_name=s.node_name or "",
                scheduler_name=s.scheduler_name or "",
                priority=s.priority or 0,
                containers=s.containers or (),
                init_containers=s.init_containers or (),
            ),
        )


class FilterArgs(msgspec.Struct, frozen=True, kw_only=True):
    """``ExtenderArgs`` as decoded: the pod, and node names (node cache) or full nodes (dry run).

    ``node_names`` and ``wanted`` (the same names as a set) may be shared with earlier requests that sent
    the same list: read them, never change them."""

    pod: Pod | None = None
    node_names: list[str] | None = None
    wanted: frozenset[str] = frozenset()
    nodes: RawNodeList | None = None
    node_objects: list[Node] = msgspec.field(default_factory=list)


_TOP: Final = msgspec.json.Decoder(dict[str, msgspec.Raw])
_POD: Final = msgspec.json.Decoder(_WirePod | None)
_NAMES: Final = msgspec.json.Decoder(list[str] | None)
_NODES: Final = msgspec.json.Decoder(RawNodeList | None)
_NODE: Final = msgspec.json.Decoder(Node)
_BINDING: Final = msgspec.json.Decoder(BindingArgs)
_ENCODER: Final = msgspec.json.Encoder()


# msgspec raises RecursionError (not DecodeError) for JSON nested past Python's recursion limit, even inside a
# value it only skips; that is the client's malformed input, not our fault, so it is InvalidInput too.
_UNDECODABLE: Final = (msgspec.DecodeError, RecursionError)


def _fields(body: bytes) -> dict[str, msgspec.Raw]:
    try:
        top = _TOP.decode(body)
    except _UNDECODABLE as err:
        raise InvalidInput(f"decode extender args: {err}") from err
    return {key.lower(): value for key, value in top.items()}  # Go matches keys case-insensitively


T = TypeVar("T")


def _field(decoder: msgspec.json.Decoder[T], raw: msgspec.Raw | None, what: str) -> T | None:
    if raw is None:
        return None
    try:
        return decoder.decode(raw)
    except _UNDECODABLE as err:
        raise InvalidInput(f"decode extender args: {what}: {err}") from err


class FilterArgsDecoder:
    """Decodes ``ExtenderArgs`` and remembers the last ``NodeNames``: kube-scheduler sends the same list of
    thousands of names with every pod, so comparing its bytes replaces decoding it and hashing every name."""

    def __init__(self) -> None:
        self._raw = b""
        self._names: list[str] | None = None
        self._wanted: frozenset[str] = frozenset()

    def _node_names(self, raw: msgspec.Raw | None) -> tuple[list[str] | None, frozenset[str]]:
        if raw is None:
            return None, frozenset()
        data = bytes(raw)
        if data != self._raw:
            names = _field(_NAMES, raw, "NodeNames")
            self._raw, self._names, self._wanted = data, names, frozenset(names or ())
        return self._names, self._wanted

    def decode(self, body: bytes) -> FilterArgs:
        """Raises ``InvalidInput`` for bad JSON and for a missing pod."""
        fields = _fields(body)
        pod = _field(_POD, fields.get("pod"), "Pod")
        if pod is None:
            raise InvalidInput("extender args missing pod")
        names, wanted = self._node_names(fields.get("nodenames"))
        nodes = _field(_NODES, fields.get("nodes"), "Nodes")
        objects = [_field(_NODE, item, "Nodes.items") for item in nodes.items] if nodes else []
        return FilterArgs(
            pod=pod.to_pod(),
            node_names=names,
            wanted=wanted,
            nodes=nodes,
            node_objects=[o for o in objects if isinstance(o, Node)],
        )


def decode_filter_args(body: bytes) -> FilterArgs:
    """Decode ``ExtenderArgs``; raises ``InvalidInput`` for bad JSON and for a missing pod."""
    return FilterArgsDecoder().decode(body)


def decode_binding_args(body: bytes) -> BindingArgs:
    fields = _fields(body)
    names = {"podname": "PodName", "podnamespace": "PodNamespace", "poduid": "PodUID", "node": "Node"}
    canonical = {names[k]: v for k, v in fields.items() if k in names}
    try:
        args = _BINDING.decode(_ENCODER.encode(canonical))
    except _UNDECODABLE as err:
        raise InvalidInput(f"decode binding args: {err}") from err
    if not args.pod_name or not args.node:
        raise InvalidInput("binding args need PodName and Node")
    return args


class MetaPod(msgspec.Struct, frozen=True, kw_only=True, rename={"uid": "UID"}):
    uid: str


class MetaVictims(
    msgspec.Struct, frozen=True, kw_only=True, rename={"pods": "Pods", "num_pdb_violations": "NumPDBViolations"}
):
    pods: list[MetaPod]
    num_pdb_violations: int = 0


class PreemptionResult(
    msgspec.Struct, frozen=True, kw_only=True, rename={"node_name_to_meta_victims": "NodeNameToMetaVictims"}
):
    """``ExtenderPreemptionResult``: always the meta form, whichever form the request used."""

    node_name_to_meta_victims: dict[str, MetaVictims] | None = None


class PreemptionArgs(msgspec.Struct, frozen=True, kw_only=True):
    """``ExtenderPreemptionArgs`` as the extender uses it: the preemptor and the candidate nodes (the keys of
    ``NodeNameToMetaVictims`` with a node cache, of ``NodeNameToVictims`` without). The victims
    kube-scheduler proposes are not needed: it cannot see GPU slices, so the extender chooses its own."""

    pod: Pod
    nodes: list[str]


_VICTIM_MAP: Final = msgspec.json.Decoder(dict[str, msgspec.Raw] | None)


def decode_preemption_args(body: bytes) -> PreemptionArgs:
    """Raises ``InvalidInput`` for bad JSON and for a missing pod."""
    fields = _fields(body)
    pod = _field(_POD, fields.get("pod"), "Pod")
    if pod is None:
        raise InvalidInput("preemption args missing pod")
    nodes: dict[str, None] = {}
    for key, what in (("nodenametometavictims", "NodeNameToMetaVictims"), ("nodenametovictims", "NodeNameToVictims")):
        for name in _field(_VICTIM_MAP, fields.get(key), what) or {}:
            nodes.setdefault(name)
    return PreemptionArgs(pod=pod.to_pod(), nodes=list(nodes))


def encode(value: msgspec.Struct | list[HostPriority]) -> bytes:
    return _ENCODER.encode(value)
