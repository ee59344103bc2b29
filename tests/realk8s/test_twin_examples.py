"""The real twin of ``hami up --examples``: every NVIDIA example of ``examples/`` applied with the real kubectl
to a real control plane (kube-apiserver calls our webhook, kube-scheduler our extender), and each pod placed
as its comment promises, or, for cannot-fit.yaml, left Pending with kube-scheduler's FailedScheduling event.

The policy examples go in after the others are placed, one at a time, so the node and card they pick can be
judged against the usage the others left: binpack takes the busiest node, spread the idlest; on the chosen
node GPU binpack takes the busiest card, GPU spread the idlest.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import pytest
import yaml

from hami_common import envvars
from hami_common.annotations import (
    DEVICES_ALLOCATED,
    USE_GPUTYPE,
    USE_GPUUUID,
    ContainerDevice,
    decode_pod_devices,
)
from hami_common.kube import Pod
from hami_sim.realk8s import K8sBinaries
from hami_sim.stack import LocalCluster, gpu_uuid
from hami_sim.stack.audit import audit as audit_cluster
from hami_sim.waiting import eventually
from tests.realk8s.conftest import failed_scheduling, kubectl, real_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FIRST = ("cores", "gpu-type", "gpu-uuid", "memory-mib", "memory-percentage", "numa-bind", "several-gpus")
POLICIES = ("node-binpack-gpu-spread", "node-spread-gpu-binpack")
LAST = ("init-containers", "cannot-fit")
ELSEWHERE = ("mig",)  # test_twin_mig.py (a MIG node); examples/vendors and examples/preemption have their own
NODES = 3  # gpu-uuid.yaml names a card of gpu-node-2
SLOTS = 10  # the stack's split count
FULL_CORES = 100


def devices(pod: Pod) -> list[tuple[ContainerDevice, ...]]:
    """The devices of each container that holds any (the annotation ends with an empty entry)."""
    return [c for c in decode_pod_devices(pod.metadata.annotations[DEVICES_ALLOCATED], DEVICES_ALLOCATED) if c]


def card_usage(pods: Iterable[Pod]) -> dict[str, tuple[int, int, int]]:
    """GPU UUID -> (containers, cores, MiB) granted on it."""
    found: dict[str, tuple[int, int, int]] = {}
    for pod in pods:
        for container in devices(pod):
            for dev in container:
                n, cores, mem = found.get(dev.uuid, (0, 0, 0))
                found[dev.uuid] = (n + 1, cores + dev.usedcores, mem + dev.usedmem)
    return found


def fraction(n: int, cores: int, mem: int, cards: int, memory_mib: int) -> float:
    """HAMi's usage score of a card or a node: the used share of its slots, cores and memory, summed."""
    return n / (cards * SLOTS) + cores / (cards * FULL_CORES) + mem / (cards * memory_mib)


class Usage:
    """What the placed pods hold, per card and per node, as the extender's policies weigh it."""

    def __init__(self, cluster: LocalCluster, pods: Iterable[Pod]) -> None:
        config = cluster.config
        self.memory_mib = config.gpu_memory_mib
        self.cards = {n: [gpu_uuid(n, i) for i in range(config.gpus_on(n))] for n in config.node_names()}
        self.by_card = card_usage(pods)

    def card(self, uuid: str) -> float:
        return fraction(*self.by_card.get(uuid, (0, 0, 0)), cards=1, memory_mib=self.memory_mib)

    def node(self, node: str) -> float:
        held = [self.by_card.get(u, (0, 0, 0)) for u in self.cards[node]]
        n, cores, mem = (sum(h[i] for h in held) for i in range(3))
        return fraction(n, cores, mem, cards=len(self.cards[node]), memory_mib=self.memory_mib)


def only(pod: Pod) -> ContainerDevice:
    (container,) = devices(pod)
    (dev,) = container
    return dev


async def apply(binaries: K8sBinaries, cluster: LocalCluster, names: Sequence[str]) -> dict[str, str]:
    """``kubectl apply -f`` the examples; their pods' UIDs by name."""
    args = [arg for name in names for arg in ("-f", str(EXAMPLES / f"{name}.yaml"))]
    out = await asyncio.to_thread(kubectl, binaries, cluster, "apply", *args)
    uids = {}
    for name in names:
        assert f"pod/{name} created" in out, out
        uids[name] = (await cluster.kube.get_pod("default", name)).metadata.uid
    return uids


async def placed(cluster: LocalCluster, uids: Mapping[str, str]) -> dict[str, Pod]:
    """Wait until the kubelet admitted every pod; then every pod as stored, audited as the e2e tests do."""
    async with asyncio.timeout(120):
        admitted = await cluster.wait_admitted(uids.values())
    assert all(a.admission.ok for a in admitted.values()), [a.admission for a in admitted.values()]
    listed, _ = await cluster.kube.list_pods("default")
    report = audit_cluster(listed, cluster.admitted, cluster.capacity())
    assert report.problems == []
    return {p.metadata.name: p for p in listed if p.metadata.uid in cluster.admitted}


def test_every_nvidia_example_has_its_real_twin() -> None:
    assert {p.stem for p in EXAMPLES.glob("*.yaml")} == {*FIRST, *POLICIES, *LAST, *ELSEWHERE}


@pytest.mark.timeout(420)
async def test_every_example_applied_with_kubectl_is_placed_as_it_promises(
    k8s: K8sBinaries, tmp_path: Path, sockdir: Path
) -> None:
    async with LocalCluster(real_config(tmp_path, sockdir, nodes=NODES)) as cluster:
        memory = cluster.config.gpu_memory_mib
        pods = await placed(cluster, await apply(k8s, cluster, FIRST))
        admitted = {name: cluster.admitted[pods[name].metadata.uid] for name in FIRST}

        # cores.yaml: 30% of the SMs and 4000 MiB
        envs = admitted["cores"].admission.container("main").envs
        assert (envs[envvars.CUDA_DEVICE_SM_LIMIT], envs[envvars.memory_limit(0)]) == ("30", "4000m")
        # gpu-type.yaml: an A100 (every card here is one; the webhook and extender must still let it through)
        assert only(pods["gpu-type"]).usedmem == 2000
        # gpu-uuid.yaml: exactly the card it names, GPU 3 of gpu-node-2
        wanted = yaml.safe_load((EXAMPLES / "gpu-uuid.yaml").read_text())["metadata"]["annotations"][USE_GPUUUID]
        assert wanted == gpu_uuid("gpu-node-2", 3)
        assert only(pods["gpu-uuid"]).uuid == wanted
        assert pods["gpu-uuid"].spec.node_name == "gpu-node-2"
        assert admitted["gpu-uuid"].admission.container("main").envs[envvars.NVIDIA_VISIBLE_DEVICES] == wanted
        # memory-mib.yaml: a 3000 MiB card
        assert admitted["memory-mib"].admission.container("main").envs[envvars.memory_limit(0)] == "3000m"
        # memory-percentage.yaml: a quarter of an 80 GiB card
        assert only(pods["memory-percentage"]).usedmem == memory // 4
        # numa-bind.yaml: two cards of one NUMA node (cards 0-3 are on NUMA 0, 4-7 on NUMA 1)
        node = pods["numa-bind"].spec.node_name
        (pair,) = devices(pods["numa-bind"])
        index = {gpu_uuid(node, i): i for i in range(cluster.config.gpus_per_node)}
        halves = {index[d.uuid] // (cluster.config.gpus_per_node // 2) for d in pair}
        assert len({d.uuid for d in pair}) == 2, pair
        assert len(halves) == 1, pair
        # several-gpus.yaml: two distinct cards, 8000 MiB and 50% of the cores on each
        (two,) = devices(pods["several-gpus"])
        assert len({d.uuid for d in two}) == 2
        assert {(d.usedmem, d.usedcores) for d in two} == {(8000, 50)}
        envs = admitted["several-gpus"].admission.container("main").envs
        assert envs[envvars.NVIDIA_VISIBLE_DEVICES].split(",") == [d.uuid for d in two]
        assert (envs[envvars.memory_limit(0)], envs[envvars.memory_limit(1)]) == ("8000m", "8000m")

        # node-binpack-gpu-spread.yaml: the busiest node, its idlest card; node-spread-gpu-binpack.yaml: the
        # idlest node, its busiest card
        for name, node_busiest, card_busiest in zip(POLICIES, (True, False), (False, True), strict=True):
            listed, _ = await cluster.kube.list_pods("default")
            usage = Usage(cluster, [p for p in listed if DEVICES_ALLOCATED in p.metadata.annotations])
            node_scores = {n: usage.node(n) for n in usage.cards}
            assert len(set(node_scores.values())) > 1, node_scores  # else any node would do
            pods = await placed(cluster, await apply(k8s, cluster, [name]))
            chosen = pods[name].spec.node_name
            pick = max if node_busiest else min
            assert node_scores[chosen] == pick(node_scores.values()), (name, chosen, node_scores)
            card_scores = {u: usage.card(u) for u in usage.cards[chosen]}
            assert len(set(card_scores.values())) > 1, card_scores  # else any card would do
            pick = max if card_busiest else min
            assert card_scores[only(pods[name]).uuid] == pick(card_scores.values()), (name, card_scores)

        # init-containers.yaml: the init container's slice and then the app's, each answered as granted
        # cannot-fit.yaml: Pending, with kube-scheduler's event naming the reason on every node
        uids = await apply(k8s, cluster, LAST)
        pods = await placed(cluster, {"init-containers": uids["init-containers"]})
        granted = {(d.usedmem, d.usedcores) for c in devices(pods["init-containers"]) for d in c}
        assert granted == {(1000, 0), (5000, 20)}
        answers = cluster.admitted[uids["init-containers"]].admission
        assert answers.container("warm-up").envs[envvars.memory_limit(0)] == "1000m"
        assert answers.container("main").envs[envvars.memory_limit(0)] == "5000m"
        assert answers.container("main").envs[envvars.CUDA_DEVICE_SM_LIMIT] == "20"

        # and the selection examples turned round (a card type no node has, a UUID no card has) are refused
        # on every node for that reason: the annotations, not luck, placed the examples above
        for name, key, value in (("gpu-type", USE_GPUTYPE, "V100"), ("gpu-uuid", USE_GPUUUID, gpu_uuid("x", 0))):
            manifest = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
            manifest["metadata"]["name"] = f"{name}-elsewhere"
            manifest["metadata"]["annotations"] = {key: value}
            path = tmp_path / f"{name}-elsewhere.yaml"
            path.write_text(yaml.safe_dump(manifest))
            await asyncio.to_thread(kubectl, k8s, cluster, "apply", "-f", str(path))
            uids[f"{name}-elsewhere"] = (await cluster.kube.get_pod("default", f"{name}-elsewhere")).metadata.uid

        for name, reason in (
            ("cannot-fit", "CardInsufficientMemory"),
            ("gpu-type-elsewhere", "CardTypeMismatch"),
            ("gpu-uuid-elsewhere", "CardUuidMismatch"),
        ):

            async def event(uid: str = uids[name]) -> str:
                return await failed_scheduling(cluster, "default", uid)

            message = await eventually(event, timeout=90, what=f"FailedScheduling of {name} from kube-scheduler")
            assert f"0/{NODES} nodes are available" in message, message
            assert reason in message, message
            stuck = await cluster.kube.get_pod("default", name)
            assert stuck.status.phase == "Pending"
            assert not stuck.spec.node_name
            assert uids[name] not in cluster.admitted
        assert cluster.failures() == {}
