"""The DRA mode's translation (docs/dra.md): HAMi's NVIDIA names as the claim HAMi's DRA driver serves.

The pure core (hami_common.dra) is checked against HAMi-DRA's translation (spec dra.md §1.1) and, beyond it,
against what extender mode means; its CEL is evaluated with cel-python on devices shaped like HAMi's plugin
publishes them. The reviewer is checked end to end: the patch applied to the pod the apiserver sent, the
templates written (not on a dry run), refusals.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

import celpy
import celpy.celtypes as ct
import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_common.annotations import (
    GPU_SCHEDULER_POLICY,
    NOUSE_GPUTYPE,
    NOUSE_GPUUUID,
    NUMA_BIND,
    USE_GPUTYPE,
    USE_GPUUUID,
)
from hami_common.annotations.dra import DRA_LABEL, DRA_LABEL_ON
from hami_common.dra import (
    PARTIAL_PERCENTAGE,
    ResourceClaimTemplate,
    claim_entry_name,
    claim_spec,
    preferences,
    template_name,
    type_selector,
)
from hami_common.dra.names import (
    ATTR_NUMA_NODE,
    ATTR_PCIE_ROOT,
    DEVICE_CLASS,
    DEVICE_TYPE,
    DRIVER,
    MAX_NAME,
    REQUEST,
    TEMPLATE_PREFIX,
)
from hami_common.errors import HamiError, InvalidInput, TransientError
from hami_common.resources import (
    GPU,
    GPU_CORES,
    GPU_MEMORY,
    GPU_MEMORY_PERCENTAGE,
    GPU_PRIORITY,
    ContainerResources,
    ResourceConfig,
)
from hami_webhook.admission import AdmissionPolicy
from hami_webhook.dra import CLAIM_TAKEN, dra_policy
from hami_webhook.reviewer import TEMPLATES_FAILED, Reviewer
from tests.webhook.support import Json, container, patched, pod, response_of, review

MIB = 1024 * 1024
CONFIG = ResourceConfig()


def spec_of(limits: dict[str, str], annotations: dict[str, str] | None = None, config: ResourceConfig = CONFIG) -> Json:
    found = claim_spec(ContainerResources("main", limits), preferences(annotations or {}), config)
    assert found is not None
    result: Json = json.loads(msgspec.json.encode(found))
    return result


def hami_dra_request(count: int, capacity: dict[str, str], *selectors: str) -> Json:
    """The request HAMi-DRA writes (spec dra.md §1.1), with ours' extra selectors after its type selector."""
    return {
        "name": REQUEST,
        "exactly": {
            "deviceClassName": DEVICE_CLASS,
            "allocationMode": "ExactCount",
            "count": count,
            "selectors": [{"cel": {"expression": e}} for e in (type_selector(), *selectors)],
            "capacity": {"requests": capacity},
        },
    }


# --- the claim spec ------------------------------------------------------------------------------------------


def test_hami_dra_example_gpu_memory_and_cores_become_its_exact_request() -> None:
    spec = spec_of({GPU: "1", GPU_MEMORY: "3000", GPU_CORES: "30"})
    assert spec == {"devices": {"requests": [hami_dra_request(1, {"memory": str(3000 * MIB), "cores": "30"})]}}
    assert type_selector() == f'device.attributes["{DRIVER}"].type == "{DEVICE_TYPE}"'


@pytest.mark.parametrize(
    ("limits", "config", "capacity"),
    [
        pytest.param({GPU: "1", GPU_MEMORY: "1024"}, CONFIG, {"memory": str(1024 * MIB), "cores": "0"},
                     id="without gpucores the claim asks 0 cores, so the card is shared as in extender mode"),
        pytest.param({GPU: "1"}, CONFIG, {"cores": "100"},
                     id="a bare count asks the whole card: no memory (the driver's default) and every core"),
        pytest.param({GPU: "1", GPU_MEMORY_PERCENTAGE: "100"}, CONFIG, {"cores": "100"},
                     id="gpumem-percentage 100 is the whole card, exclusive as HAMi makes it"),
        pytest.param({GPU: "1", GPU_MEMORY_PERCENTAGE: "100", GPU_CORES: "20"}, CONFIG, {"cores": "20"},
                     id="gpumem-percentage 100 with cores keeps the cores asked"),
        pytest.param({GPU: "1", GPU_MEMORY: "1000"}, ResourceConfig(memory_factor=4),
                     {"memory": str(4000 * MIB), "cores": "0"}, id="memoryFactor scales the MiB as the extender does"),
        pytest.param({GPU: "1"}, ResourceConfig(default_memory=2048, default_cores=10),
                     {"memory": str(2048 * MIB), "cores": "100"},
                     id="defaultMemory fills unasked memory; a bare count stays exclusive, as HAMi makes it"),
        pytest.param({GPU: "1", GPU_MEMORY: "10"}, ResourceConfig(default_cores=10),
                     {"memory": str(10 * MIB), "cores": "10"}, id="defaultCores fills unasked cores"),
    ],
)  # fmt: skip
def test_capacity_follows_hami_semantics(limits: dict[str, str], config: ResourceConfig, capacity: Json) -> None:
    assert spec_of(limits, config=config)["devices"]["requests"][0]["exactly"]["capacity"]["requests"] == capacity


def test_memory_alone_asks_default_gpu_num_cards() -> None:
    spec = spec_of({GPU_MEMORY: "500"}, config=ResourceConfig(default_gpu_num=2))
    assert spec["devices"]["requests"][0]["exactly"]["count"] == 2


def test_a_container_without_nvidia_resources_has_no_claim() -> None:
    assert claim_spec(ContainerResources("main", {"cpu": "1"}), preferences({}), CONFIG) is None


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        pytest.param({GPU: "1", GPU_MEMORY_PERCENTAGE: "50"},
                     PARTIAL_PERCENTAGE.format(name="main", resource=GPU_MEMORY_PERCENTAGE, percentage=50,
                                               memory=GPU_MEMORY),
                     id="a partial percentage is refused: a claim asks bytes, and says to ask MiB"),
        pytest.param({GPU: "1", GPU_MEMORY_PERCENTAGE: "150"}, "must be an integer between 0 and 100",
                     id="a percentage past 100 is refused as in extender mode"),
        pytest.param({GPU: "1", GPU_CORES: "150"}, "it is too large", id="cores past 100 are refused"),
        pytest.param({GPU: "1", GPU_MEMORY: "1.5"}, "it is not a whole number", id="fractional MiB are refused"),
        pytest.param({GPU: "x"}, "it is not a quantity", id="a count that is no quantity is refused"),
    ],
)  # fmt: skip
def test_quantities_that_cannot_be_claimed_are_refused(limits: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidInput, match=message.replace("(", r"\(").replace(")", r"\)")):
        spec_of(limits)


def test_more_than_one_card_asks_distinct_cards_and_the_preferred_topology() -> None:
    spec = spec_of({GPU: "2", GPU_MEMORY: "100"}, {NUMA_BIND: "true", GPU_SCHEDULER_POLICY: "binpack,topology-aware"})
    assert spec["devices"]["constraints"] == [
        {"requests": [REQUEST], "distinctAttribute": f"{DRIVER}/uuid"},
        {"requests": [REQUEST], "matchAttribute": ATTR_NUMA_NODE},
        {"requests": [REQUEST], "matchAttribute": ATTR_PCIE_ROOT},
    ]


@pytest.mark.parametrize(
    "annotations",
    [
        pytest.param({NUMA_BIND: "true"}, id="numa-bind on one card needs no constraint"),
        pytest.param({NUMA_BIND: "false", GPU_SCHEDULER_POLICY: "spread"}, id="no topology asked, none written"),
    ],
)
def test_one_card_has_no_constraint(annotations: dict[str, str]) -> None:
    assert "constraints" not in spec_of({GPU: "1"}, annotations)["devices"]


def test_the_numa_gpu_policy_asks_one_numa_node_like_numa_bind() -> None:
    spec = spec_of({GPU: "2"}, {GPU_SCHEDULER_POLICY: "numa"})
    assert {"requests": [REQUEST], "matchAttribute": ATTR_NUMA_NODE} in spec["devices"]["constraints"]


# --- the selectors, evaluated on HAMi-shaped devices ------------------------------------------------------------


def _lower_ascii(text: ct.StringType) -> ct.StringType:
    return ct.StringType(text.lower())


def selects(spec: Json, product: str, uuid: str) -> bool:
    """Whether every selector of the claim's request admits a HAMi device with this productName and uuid."""
    attributes = {"type": DEVICE_TYPE, "productName": product, "uuid": uuid}
    device = ct.MapType(
        {
            ct.StringType("driver"): ct.StringType(DRIVER),
            ct.StringType("attributes"): ct.MapType(
                {ct.StringType(DRIVER): ct.MapType({ct.StringType(k): ct.StringType(v) for k, v in attributes.items()})}
            ),
        }
    )
    env = celpy.Environment()
    for selector in spec["devices"]["requests"][0]["exactly"]["selectors"]:
        program = env.program(env.compile(selector["cel"]["expression"]), functions={"lowerAscii": _lower_ascii})
        if not program.evaluate({"device": device}):
            return False
    return True


@pytest.mark.parametrize(
    ("annotations", "product", "uuid", "chosen"),
    [
        pytest.param({}, "NVIDIA A100-SXM4-40GB", "GPU-1", True, id="no preference takes any HAMi GPU"),
        pytest.param({USE_GPUTYPE: "a100, H100"}, "NVIDIA A100-SXM4-40GB", "GPU-1", True,
                     id="use-gputype matches a substring of the product name, in any case (as HAMi's type match)"),
        pytest.param({USE_GPUTYPE: "H100"}, "NVIDIA A100-SXM4-40GB", "GPU-1", False,
                     id="use-gputype refuses other products"),
        pytest.param({NOUSE_GPUTYPE: "A100"}, "NVIDIA A100-SXM4-40GB", "GPU-1", False,
                     id="nouse-gputype refuses a matching product"),
        pytest.param({NOUSE_GPUTYPE: "T4"}, "NVIDIA A100-SXM4-40GB", "GPU-1", True,
                     id="nouse-gputype keeps other products"),
        pytest.param({USE_GPUUUID: "GPU-1,GPU-2"}, "T4", "GPU-2", True, id="use-gpuuuid takes a listed card"),
        pytest.param({USE_GPUUUID: "GPU-1"}, "T4", "GPU-2", False, id="use-gpuuuid refuses an unlisted card"),
        pytest.param({NOUSE_GPUUUID: "GPU-2"}, "T4", "GPU-2", False, id="nouse-gpuuuid refuses a listed card"),
        pytest.param({USE_GPUTYPE: " , "}, "T4", "GPU-2", True, id="an empty list asks nothing, as in extender mode"),
    ],
)  # fmt: skip
def test_annotations_become_selectors(annotations: dict[str, str], product: str, uuid: str, chosen: bool) -> None:
    assert selects(spec_of({GPU: "1"}, annotations), product, uuid) is chosen


@pytest.mark.parametrize(
    "value",
    ['A100"] || true || ["', "a\\b", "x\ny", "é", "A" * 257],
    ids=["quote", "backslash", "newline", "non-ascii", "long"],
)
def test_values_that_could_escape_a_cel_literal_are_refused(value: str) -> None:
    with pytest.raises(InvalidInput, match=USE_GPUTYPE):
        preferences({USE_GPUTYPE: value})


@given(st.dictionaries(st.sampled_from([USE_GPUTYPE, NOUSE_GPUTYPE, USE_GPUUUID, NOUSE_GPUUUID]), st.text(max_size=40)))
def test_any_annotation_is_refused_or_compiles_to_cel(annotations: dict[str, str]) -> None:
    try:
        prefs = preferences(annotations)
    except InvalidInput:
        return
    found = claim_spec(ContainerResources("main", {GPU: "1"}), prefs, CONFIG)
    assert found is not None
    env = celpy.Environment()
    for selector in found.devices.requests[0].exactly.selectors:
        env.compile(selector.cel.expression)  # raises CELParseError on anything that is not one expression


@given(st.dictionaries(st.sampled_from([GPU, GPU_MEMORY, GPU_MEMORY_PERCENTAGE, GPU_CORES]), st.text(max_size=12)))
def test_any_quantity_is_refused_or_claimed(limits: dict[str, str]) -> None:
    try:
        found = claim_spec(ContainerResources("main", limits), preferences({}), CONFIG)
    except InvalidInput:
        return
    if found is not None:
        exactly = found.devices.requests[0].exactly
        assert exactly.count >= 1
        assert exactly.capacity is not None
        assert all(text.isdigit() for text in exactly.capacity.requests.values())


# --- names -------------------------------------------------------------------------------------------------------


def test_identical_specs_share_a_template_and_different_ones_do_not() -> None:
    one = claim_spec(ContainerResources("a", {GPU: "1", GPU_MEMORY: "10"}), preferences({}), CONFIG)
    same = claim_spec(ContainerResources("b", {GPU: "1", GPU_MEMORY: "10"}), preferences({}), CONFIG)
    other = claim_spec(ContainerResources("a", {GPU: "1", GPU_MEMORY: "11"}), preferences({}), CONFIG)
    assert one is not None
    assert same is not None
    assert other is not None
    assert template_name(one) == template_name(same) != template_name(other)
    assert template_name(one).startswith(TEMPLATE_PREFIX)


def test_entry_names_are_dns_labels_even_for_long_container_names() -> None:
    assert claim_entry_name("main") == "main-nvidia"
    long = claim_entry_name("c" * 63)
    assert len(long) == MAX_NAME
    assert long != claim_entry_name("c" * 62 + "d")


# --- through the reviewer ------------------------------------------------------------------------------------------


class Recorder:
    """A TemplateWriter that keeps what it was asked to write, or fails as the apiserver can."""

    def __init__(self, error: HamiError | None = None) -> None:
        self.written: list[ResourceClaimTemplate] = []
        self.error = error

    async def ensure(self, templates: Sequence[ResourceClaimTemplate]) -> None:
        if self.error is not None:
            raise self.error
        self.written.extend(templates)


def dra_reviewer(writer: Recorder, policy: AdmissionPolicy | None = None) -> Reviewer:
    return Reviewer(dra_policy(policy or AdmissionPolicy()), templates=writer)


def answer(reviewer: Reviewer, body: Json) -> Json:
    status, raw = asyncio.run(reviewer.review_and_write(json.dumps(body).encode()))
    assert status == 200
    return response_of(raw)


def test_a_hami_pod_becomes_claim_references_and_a_template() -> None:
    writer = Recorder()
    original = pod(container(limits={GPU: "1", GPU_MEMORY: "3000", "cpu": "1"}), name="p", namespace="team")
    response = answer(dra_reviewer(writer), review(original))
    assert response["allowed"] is True, response
    stored = patched(original, response)
    [template] = writer.written
    assert template.metadata.namespace == "team"
    assert template.metadata.labels == {DRA_LABEL: DRA_LABEL_ON}
    main = stored["spec"]["containers"][0]
    assert main["resources"]["limits"] == {"cpu": "1"}
    assert main["resources"]["claims"] == [{"name": "main-nvidia"}]
    assert stored["spec"]["resourceClaims"] == [
        {"name": "main-nvidia", "resourceClaimTemplateName": template.metadata.name}
    ]
    assert stored["metadata"]["labels"][DRA_LABEL] == DRA_LABEL_ON
    assert stored["spec"]["schedulerName"] == "default-scheduler"  # the default scheduler allocates claims
    capacity = json.loads(msgspec.json.encode(template.spec.spec))["devices"]["requests"][0]["exactly"]["capacity"]
    assert capacity == {"requests": {"memory": str(3000 * MIB), "cores": "0"}}


def test_extender_edits_of_hami_resources_are_replaced_and_the_others_kept() -> None:
    writer = Recorder()
    init = container("warm", limits={GPU_MEMORY: "100"})  # extender mode would add nvidia.com/gpu: 1
    main = container(limits={GPU: "2", GPU_PRIORITY: "1"}, requests={GPU: "2"})  # and cores 100 here
    original = pod(main, init=(init,))
    response = answer(dra_reviewer(writer, AdmissionPolicy(gpu_core_policy="force")), review(original))
    stored = patched(original, response)
    for ctr in (stored["spec"]["initContainers"][0], stored["spec"]["containers"][0]):
        assert not any(name.startswith("nvidia.com/") for name in ctr["resources"].get("limits", {}))
        assert not any(name.startswith("nvidia.com/") for name in ctr["resources"].get("requests", {}))
        assert {"name": "GPU_CORE_UTILIZATION_POLICY", "value": "force"} in ctr["env"]
    assert {"name": "CUDA_TASK_PRIORITY", "value": "1"} in stored["spec"]["containers"][0]["env"]
    assert [e["name"] for e in stored["spec"]["resourceClaims"]] == ["warm-nvidia", "main-nvidia"]
    assert len(writer.written) == 2


def test_a_pod_naming_another_scheduler_is_translated_all_the_same_as_hami_dra_does() -> None:
    original = pod(container(limits={GPU: "1"}), scheduler="volcano")
    stored = patched(original, answer(dra_reviewer(Recorder()), review(original)))
    assert stored["spec"]["schedulerName"] == "volcano"
    assert stored["spec"]["resourceClaims"][0]["name"] == "main-nvidia"


def test_a_pod_written_for_hami_dra_claims_passes_unchanged() -> None:
    writer = Recorder()
    main = container(limits={"cpu": "1"})
    main["resources"]["claims"] = [{"name": "gpu"}]
    original = pod(main)
    original["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "team-p-main"}]
    response = answer(dra_reviewer(writer), review(original))
    assert response["allowed"] is True
    assert "patch" not in response
    assert writer.written == []


def test_claims_are_appended_beside_the_pods_own() -> None:
    main = container(limits={GPU: "1"})
    main["resources"]["claims"] = [{"name": "fpga"}]
    original = pod(main, annotations={"a": "b"})
    original["metadata"]["labels"] = {"app": "x"}
    original["spec"]["resourceClaims"] = [{"name": "fpga", "resourceClaimName": "f"}]
    stored = patched(original, answer(dra_reviewer(Recorder()), review(original)))
    assert [c["name"] for c in stored["spec"]["containers"][0]["resources"]["claims"]] == ["fpga", "main-nvidia"]
    assert [c["name"] for c in stored["spec"]["resourceClaims"]] == ["fpga", "main-nvidia"]
    assert stored["metadata"]["labels"] == {"app": "x", DRA_LABEL: DRA_LABEL_ON}


@pytest.mark.parametrize(
    ("limits", "annotations", "message"),
    [
        pytest.param({GPU: "1", GPU_MEMORY_PERCENTAGE: "30"}, {}, "cannot be asked in DRA mode",
                     id="a partial percentage is refused with why"),
        pytest.param({GPU: "1"}, {USE_GPUUUID: 'GPU-1"'}, USE_GPUUUID, id="a uuid that is no CEL literal is refused"),
    ],
)  # fmt: skip
def test_untranslatable_pods_are_refused_400_and_nothing_is_written(
    limits: dict[str, str], annotations: dict[str, str], message: str
) -> None:
    writer = Recorder()
    response = answer(dra_reviewer(writer), review(pod(container(limits=limits), annotations=annotations)))
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert message in response["status"]["message"]
    assert writer.written == []


def test_an_entry_name_the_pod_already_uses_is_refused() -> None:
    original = pod(container(limits={GPU: "1"}))
    original["spec"]["resourceClaims"] = [{"name": "main-nvidia", "resourceClaimName": "x"}]
    response = answer(dra_reviewer(Recorder()), review(original))
    assert response["status"]["message"] == CLAIM_TAKEN.format(container="main", name="main-nvidia")


def test_a_dry_run_writes_no_template_but_shows_the_patch() -> None:
    writer = Recorder()
    body = review(pod(container(limits={GPU: "1"})))
    body["request"]["dryRun"] = True
    response = answer(dra_reviewer(writer), body)
    assert response["allowed"] is True
    assert "patch" in response
    assert writer.written == []


def test_a_template_that_cannot_be_written_refuses_the_pod_500() -> None:
    writer = Recorder(TransientError("apiserver unreachable"))
    body = review(pod(container(limits={GPU: "1"})))
    response = answer(dra_reviewer(writer), body)
    assert response["allowed"] is False
    assert response["uid"] == body["request"]["uid"]
    assert response["status"]["code"] == 500
    assert response["status"]["message"] == TEMPLATES_FAILED.format(error="apiserver unreachable")


def test_the_rules_still_judge_first_a_privileged_gpu_container_is_denied() -> None:
    writer = Recorder()
    response = answer(dra_reviewer(writer), review(pod(container(limits={GPU: "1"}, privileged=True))))
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert writer.written == []


def test_outside_dra_mode_nothing_changes() -> None:
    reviewer = Reviewer(AdmissionPolicy())
    _status, raw = asyncio.run(
        reviewer.review_and_write(json.dumps(review(pod(container(limits={GPU: "1"})))).encode())
    )
    stored = patched(pod(container(limits={GPU: "1"})), response_of(raw))
    assert "resourceClaims" not in stored["spec"]
    assert stored["spec"]["schedulerName"] == "hami-scheduler"
