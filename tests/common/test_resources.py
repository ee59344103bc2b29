"""Per-container requests against hami-protocol §1.2, §3 and §8 cases 7-10."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_common.errors import InvalidInput
from hami_common.resources import (
    GPU,
    GPU_CORES,
    GPU_MEMORY,
    GPU_MEMORY_PERCENTAGE,
    GPU_PRIORITY,
    UNSET_PERCENTAGE,
    ContainerResources,
    DeviceRequest,
    ResourceConfig,
    container_request,
    is_exclusive,
    needs_default_gpu_num,
    pod_request,
    validate_percentage,
)

DEFAULT = ResourceConfig()


def limits(**quantities: str) -> ContainerResources:
    names = {
        "gpu": GPU,
        "mem": GPU_MEMORY,
        "pct": GPU_MEMORY_PERCENTAGE,
        "cores": GPU_CORES,
        "prio": GPU_PRIORITY,
    }
    return ContainerResources(name="main", limits={names[k]: v for k, v in quantities.items()})


def summary(request: DeviceRequest | None) -> tuple[int, int, int, int] | None:
    if request is None:
        return None
    return (request.nums, request.memreq, request.mem_percentage, request.coresreq)


@pytest.mark.parametrize(
    ("container", "expected"),
    [
        pytest.param(limits(gpu="1"), (1, 0, 100, 0), id="a bare count takes the whole card's memory"),
        pytest.param(limits(gpu="2", mem="4096"), (2, 4096, 101, 0), id="explicit MiB leave percentage unset"),
        pytest.param(limits(gpu="1", pct="50"), (1, 0, 50, 0), id="a percentage is kept"),
        pytest.param(limits(gpu="1", pct="150"), (1, 0, 100, 0), id="a percentage above 100 is clamped"),
        pytest.param(limits(gpu="1", pct="0"), (1, 0, 100, 0), id="a zero percentage counts as unset"),
        pytest.param(limits(gpu="1", mem="2000", pct="0"), (1, 2000, 101, 0), id="MiB win over a zero percentage"),
        pytest.param(limits(gpu="1", cores="50"), (1, 0, 100, 50), id="cores are taken as given"),
        pytest.param(
            ContainerResources(name="main", requests={GPU: "1"}),
            (1, 0, 100, 0),
            id="a count only in requests",
        ),
        pytest.param(limits(mem="1000"), None, id="memory without a count is not a request"),
        pytest.param(limits(gpu="0"), None, id="a zero count is not a request"),
    ],
)
def test_generate_resource_requests_matches_hami(
    container: ContainerResources, expected: tuple[int, int, int, int] | None
) -> None:
    assert summary(container_request(container, DEFAULT)) == expected


def test_memory_factor_multiplies_mib() -> None:
    config = ResourceConfig(memory_factor=2)
    assert summary(container_request(limits(gpu="1", mem="1024"), config)) == (1, 2048, UNSET_PERCENTAGE, 0)


@pytest.mark.parametrize(
    ("container", "config", "message"),
    [
        pytest.param(
            limits(gpu="1", mem="16Gi"),
            DEFAULT,
            "invalid nvidia.com/gpumem value '16Gi' in container main: it is too large; "
            "it must be a whole number from 0 to 2147483647",
            id="memory past int32",
        ),
        pytest.param(
            limits(gpu="1", mem="1Gi"),
            ResourceConfig(memory_factor=2),
            "invalid nvidia.com/gpumem value '1Gi' in container main: it is too large; "
            "it must be a whole number from 0 to 1073741823",
            id="memory past int32 once times memoryFactor",
        ),
        pytest.param(
            limits(gpu="3221225472"),
            DEFAULT,
            "invalid nvidia.com/gpu value '3221225472' in container main: it is too large; "
            "it must be a whole number from 0 to 2147483647",
            id="a count past int32",
        ),
        pytest.param(
            limits(gpu="1", pct="-1"),
            DEFAULT,
            "invalid nvidia.com/gpumem-percentage value '-1' in container main: it is negative; "
            "it must be a whole number from 0 to 2147483647",
            id="a negative percentage",
        ),
        pytest.param(
            limits(gpu="0", mem="16Gi"),
            DEFAULT,
            "invalid nvidia.com/gpumem value '16Gi' in container main: it is too large; "
            "it must be a whole number from 0 to 2147483647",
            id="read even where no GPU is counted",
        ),
    ],
)
def test_a_quantity_that_cannot_be_read_is_an_error_never_no_gpu(
    container: ContainerResources, config: ResourceConfig, message: str
) -> None:
    """HAMi reads these as "no GPU", so a pod naming one was bound with no placement (and served another
    pod's grant at Allocate); here they are an error naming the resource and the range it accepts."""
    with pytest.raises(InvalidInput) as err:
        container_request(container, config)
    assert str(err.value) == message


def test_default_memory_applies_when_neither_mib_nor_percentage_is_asked() -> None:
    config = ResourceConfig(default_memory=2048, default_cores=10)
    assert summary(container_request(limits(gpu="1"), config)) == (1, 2048, UNSET_PERCENTAGE, 10)


def test_priority_comes_from_limits() -> None:
    request = container_request(limits(gpu="1", prio="1"), DEFAULT)
    assert request is not None
    assert request.priority == 1


def test_percentage_request_resolves_against_the_card() -> None:
    request = container_request(limits(gpu="1", pct="30"), DEFAULT)
    assert request is not None
    assert request.memory_on(total_mib=10000) == 3000


def test_fractional_mib_is_a_clear_error_naming_the_container() -> None:
    with pytest.raises(InvalidInput, match="container main"):
        container_request(limits(gpu="1", mem="1500m"), DEFAULT)


def test_malformed_quantity_is_invalid_input() -> None:
    with pytest.raises(InvalidInput, match=GPU):
        container_request(limits(gpu="one"), DEFAULT)


def test_pod_request_lists_init_containers_first_with_gaps_for_cpu_containers() -> None:
    init = [ContainerResources("setup", limits={GPU: "1", GPU_MEMORY: "1000"})]
    app = [ContainerResources("sidecar"), ContainerResources("main", limits={GPU: "1", GPU_MEMORY: "200"})]
    request = pod_request(init, app, DEFAULT)
    assert [summary(r) for r in request.containers] == [(1, 1000, 101, 0), None, (1, 200, 101, 0)]
    assert request.has_devices


def test_pod_without_gpu_containers_has_no_devices() -> None:
    assert not pod_request([], [ContainerResources("web")], DEFAULT).has_devices


@pytest.mark.parametrize(
    ("container", "exclusive"),
    [
        pytest.param(limits(gpu="1"), True, id="a bare count is exclusive"),
        pytest.param(limits(gpu="1", pct="100"), True, id="a 100 percent slice is exclusive"),
        pytest.param(limits(gpu="1", pct="50"), False, id="a half-card slice is shared"),
        pytest.param(limits(gpu="1", mem="8192"), False, id="a MiB slice is shared"),
        pytest.param(limits(gpu="1", cores="70"), False, id="explicit cores are kept"),
        pytest.param(limits(mem="1000"), False, id="no count, no exclusivity"),
    ],
)
def test_exclusive_by_default_cores(container: ContainerResources, exclusive: bool) -> None:
    assert is_exclusive(container, DEFAULT) is exclusive


@pytest.mark.parametrize(
    ("container", "needed"),
    [
        pytest.param(limits(mem="1000"), True, id="memory alone gets the default count"),
        pytest.param(limits(cores="30"), True, id="cores alone get the default count"),
        pytest.param(limits(gpu="1", mem="1000"), False, id="an explicit count stays"),
        pytest.param(ContainerResources("c", requests={GPU_MEMORY: "1000"}), False, id="requests do not count"),
    ],
)
def test_default_gpu_num_injection(container: ContainerResources, needed: bool) -> None:
    assert needs_default_gpu_num(container, DEFAULT) is needed


def test_default_gpu_num_zero_disables_injection() -> None:
    assert not needs_default_gpu_num(limits(mem="1000"), ResourceConfig(default_gpu_num=0))


@pytest.mark.parametrize("pct", ["0", "100", "37"])
def test_webhook_accepts_percentages_in_range(pct: str) -> None:
    validate_percentage(limits(gpu="1", pct=pct), DEFAULT)


@pytest.mark.parametrize("pct", ["101", "150", "-1", "2.5", "abc"])
def test_webhook_rejects_percentages_out_of_range_with_hamis_message(pct: str) -> None:
    with pytest.raises(InvalidInput) as info:
        validate_percentage(limits(gpu="1", pct=pct), DEFAULT)
    assert str(info.value) == (
        f"invalid nvidia.com/gpumem-percentage value {pct} in container main: must be an integer between 0 and 100"
    )


@given(st.dictionaries(st.sampled_from([GPU, GPU_MEMORY, GPU_MEMORY_PERCENTAGE, GPU_CORES]), st.text(max_size=12)))
def test_arbitrary_quantities_give_a_request_none_or_invalid_input(quantities: dict[str, str]) -> None:
    try:
        request = container_request(ContainerResources("c", limits=quantities), DEFAULT)
    except InvalidInput:
        return
    if request is not None:
        assert request.nums > 0
        assert 0 <= request.memreq <= 2**31 - 1
        assert 1 <= request.mem_percentage <= UNSET_PERCENTAGE


def test_absurdly_long_quantity_is_invalid_input_not_a_crash() -> None:
    with pytest.raises(InvalidInput, match="it is not a quantity"):
        container_request(limits(gpu="9" * 5000), DEFAULT)
