"""Node registration codecs against hami-protocol §2.2 and §8 cases 4-5."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_common.annotations import (
    NODE_REGISTER,
    DeviceInfo,
    MigPlacement,
    MigProfile,
    decode_legacy_node_devices,
    decode_node_devices,
    encode_node_devices,
)
from hami_common.errors import AnnotationError

TWO_V100 = (
    '[{"id":"GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec","count":10,"devmem":32768,"devcore":100,'
    '"type":"NVIDIA-Tesla V100-PCIE-32GB","mode":"hami-core","health":true},'
    '{"id":"GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448","index":1,"count":10,"devmem":32768,"devcore":100,'
    '"type":"NVIDIA-Tesla V100-PCIE-32GB","numa":1,"mode":"hami-core","health":true}]'
)


def test_worked_example_decodes_index_and_numa_zero_from_absent_fields() -> None:
    first, second = decode_node_devices(TWO_V100)
    assert (first.index, first.numa, first.health) == (0, 0, True)
    assert (second.index, second.numa, second.devmem, second.count) == (1, 1, 32768, 10)


def test_worked_example_reencodes_byte_for_byte() -> None:
    assert encode_node_devices(decode_node_devices(TWO_V100)) == TWO_V100


def test_absent_health_means_unhealthy_and_false_health_is_omitted() -> None:
    (device,) = decode_node_devices('[{"id":"GPU-1","count":10,"devmem":1024}]')
    assert device.health is False
    assert "health" not in encode_node_devices([device])


def test_hamis_marshal_case_with_mig_profile() -> None:
    profile = MigProfile(
        name="1g.5gb", memory_mb=4864, core=15, slice_count=1, placements=(MigPlacement(start=6, size=1),)
    )
    device = DeviceInfo(
        id="id-1", index=1, count=1, devmem=1024, devcore=10, type="type", numa=0, health=True,
        mig_profiles=(profile,),
    )  # fmt: skip
    encoded = json.loads(encode_node_devices([device]))
    assert encoded == [
        {
            "id": "id-1", "index": 1, "count": 1, "devmem": 1024, "devcore": 10, "type": "type",
            "migProfiles": [
                {"name": "1g.5gb", "memoryMB": 4864, "core": 15, "sliceCount": 1,
                 "placements": [{"start": 6, "size": 1}]}
            ],
            "health": True,
        }
    ]  # fmt: skip
    assert decode_node_devices(encode_node_devices([device])) == (device,)


def test_unknown_fields_from_a_newer_writer_are_ignored() -> None:
    (device,) = decode_node_devices('[{"id":"GPU-1","count":2,"futureField":{"x":1},"health":true}]')
    assert device == DeviceInfo(id="GPU-1", count=2, health=True)


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("GPU-1,10,7680,100,NVIDIA-Tesla P4,0,true:", id="the legacy colon form is not JSON"),
        pytest.param('[{"id":"GPU-1","count":-1}]', id="a negative count is rejected"),
        pytest.param('[{"id":"GPU-1","devmem":"lots"}]', id="a string where a number belongs is rejected"),
        pytest.param('[{"count":1}]', id="a device without id is rejected"),
        pytest.param('{"id":"GPU-1"}', id="an object instead of an array is rejected"),
        pytest.param("", id="an empty value is rejected"),
    ],
)
def test_malformed_registration_raises_error_naming_the_annotation(value: str) -> None:
    with pytest.raises(AnnotationError, match=NODE_REGISTER):
        decode_node_devices(value)


_name = st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=30)
_small = st.integers(min_value=0, max_value=2**31 - 1)
_devices = st.lists(
    st.builds(
        DeviceInfo, id=_name, index=_small, count=_small, devmem=_small, devcore=_small, type=st.text(max_size=30),
        numa=_small, mode=st.sampled_from(["", "hami-core", "mig"]), health=st.booleans(),
    ),
    max_size=8,
)  # fmt: skip


@given(_devices)
def test_registration_round_trips(devices: list[DeviceInfo]) -> None:
    assert decode_node_devices(encode_node_devices(devices)) == tuple(devices)


@given(st.text(max_size=300))
def test_arbitrary_text_decodes_or_raises_annotation_error(value: str) -> None:
    try:
        decode_node_devices(value)
    except AnnotationError as err:
        assert err.key == NODE_REGISTER  # noqa: PT017 - hypothesis decides whether it raises


# --- legacy colon form (HAMi: pkg/device/devices_test.go:481-692) ------------------------------------
P4 = "GPU-ebe7c3f7-303d-558d-435e-99a160631fe4"


def test_legacy_seven_fields_default_to_index_zero_and_hami_core() -> None:
    (device,) = decode_legacy_node_devices(f"{P4},10,7680,100,NVIDIA-Tesla P4,0,true:")
    assert device == DeviceInfo(
        id=P4, count=10, devmem=7680, devcore=100, type="NVIDIA-Tesla P4", numa=0, health=True, index=0,
        mode="hami-core",
    )  # fmt: skip


def test_legacy_nine_fields_carry_index_and_mode() -> None:
    (device,) = decode_legacy_node_devices(f"{P4},10,7680,100,NVIDIA-Tesla P4,0,true,1,hami-core:")
    assert (device.index, device.mode) == (1, "hami-core")


def test_legacy_lone_colon_is_no_device_and_no_error() -> None:
    assert decode_legacy_node_devices(":") == ()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param(",:", "unexpected field count 2 in node annotation", id="two empty fields"),
        pytest.param("garbage:", 'malformed node annotation segment: "garbage"', id="segment without commas"),
        pytest.param(
            f"{P4},10,7680,100,NVIDIA-Tesla P4,0,true,-1,hami-core:",
            "index field must not be negative: -1",
            id="negative index",
        ),
    ],
)
def test_legacy_errors_carry_hamis_messages(value: str, message: str) -> None:
    with pytest.raises(AnnotationError) as info:
        decode_legacy_node_devices(value)
    assert info.value.reason == message
