"""The pod device list codec against hami-protocol §2.5 and §8 cases 1-3."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_common.annotations import (
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    ContainerDevice,
    decode_pod_devices,
    encode_pod_devices,
    pop_first_container,
)
from hami_common.errors import AnnotationError

V100 = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"


def dev(uuid: str, mem: int, cores: int) -> ContainerDevice:
    return ContainerDevice(uuid=uuid, type="NVIDIA", usedmem=mem, usedcores=cores)


def test_one_container_encodes_with_device_and_container_terminators() -> None:
    assert encode_pod_devices([[ContainerDevice("UUID1", "Type1", 1000, 30)]]) == "UUID1,Type1,1000,30:;"


def test_trailing_semicolon_decodes_to_an_extra_empty_container() -> None:
    assert decode_pod_devices("UUID1,Type1,1000,30:;") == ((ContainerDevice("UUID1", "Type1", 1000, 30),), ())


def test_two_containers_decode_in_order() -> None:
    value = "GPU-8dcd,NVIDIA,500,3:;GPU-ebe7,NVIDIA,500,3:;"
    assert decode_pod_devices(value) == ((dev("GPU-8dcd", 500, 3),), (dev("GPU-ebe7", 500, 3),), ())


def test_protocol_doc_example_two_containers_on_one_v100() -> None:
    value = f"{V100},NVIDIA,3000,0:;{V100},NVIDIA,5000,0:;"
    decoded = decode_pod_devices(value)
    assert decoded[:2] == ((dev(V100, 3000, 0),), (dev(V100, 5000, 0),))
    assert encode_pod_devices(decoded[:2]) == value


def test_container_with_two_gpus_keeps_both() -> None:
    value = "UUID1,NVIDIA,1000,30:UUID2,NVIDIA,1000,30:;"
    assert decode_pod_devices(value)[0] == (dev("UUID1", 1000, 30), dev("UUID2", 1000, 30))


def test_container_without_gpu_is_a_bare_semicolon_before_the_gpu_container() -> None:
    assert encode_pod_devices([[], [dev("uuid1", 1000, 30)]]) == ";uuid1,NVIDIA,1000,30:;"


def test_fewer_than_four_fields_is_hamis_missing_fields_error() -> None:
    with pytest.raises(AnnotationError, match="missing fields") as info:
        decode_pod_devices("uuid,type,100:;")
    assert DEVICES_TO_ALLOCATE in str(info.value)


def test_error_names_the_annotation_it_was_asked_to_decode() -> None:
    with pytest.raises(AnnotationError, match=DEVICES_ALLOCATED):
        decode_pod_devices("uuid,NVIDIA,lots,0:;", key=DEVICES_ALLOCATED)


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("uuid,NVIDIA,-5,0:;", id="negative memory is rejected"),
        pytest.param("uuid,NVIDIA,5,ten:;", id="non-numeric cores are rejected"),
        pytest.param(",NVIDIA,5,1:;", id="an empty UUID is rejected"),
        pytest.param("uuid,NVIDIA,٣,1:;", id="non-ASCII digits are rejected"),
    ],
)
def test_malformed_device_fields_raise_annotation_error(value: str) -> None:
    with pytest.raises(AnnotationError):
        decode_pod_devices(value)


def test_empty_value_is_one_empty_container_as_in_hami() -> None:
    # HAMi splits "" on ";" and gets one empty string, hence one container with no devices.
    assert decode_pod_devices("") == ((),)


def test_allocate_pops_first_nonempty_entry_and_reencodes_it_empty() -> None:
    taken, rest = pop_first_container(decode_pod_devices("GPU-aaa,NVIDIA,3000,50:;"))
    assert taken == (dev("GPU-aaa", 3000, 50),)
    assert encode_pod_devices(rest) == ";;"
    assert decode_pod_devices(encode_pod_devices(rest)) == ((), (), ())


def test_pop_skips_leading_empty_containers() -> None:
    taken, rest = pop_first_container(((), (dev("a", 1, 1),), (dev("b", 2, 2),)))
    assert taken == (dev("a", 1, 1),)
    assert rest == ((), (), (dev("b", 2, 2),))


def test_pop_of_fully_served_list_returns_nothing() -> None:
    assert pop_first_container(((), ())) == ((), ((), ()))


def test_encoder_refuses_a_uuid_that_would_break_the_grammar() -> None:
    with pytest.raises(ValueError, match="holds one of"):
        encode_pod_devices([[ContainerDevice("GPU:1", "NVIDIA", 1, 1)]])


_token = st.text(alphabet=st.characters(blacklist_characters=":;,", codec="utf-8"), min_size=1)
_token = _token.filter(lambda s: s.strip() == s)
_device = st.builds(
    ContainerDevice,
    uuid=_token,
    type=_token,
    usedmem=st.integers(min_value=0, max_value=2**31 - 1),
    usedcores=st.integers(min_value=0, max_value=100),
)
_pod = st.lists(st.lists(_device, max_size=4).map(tuple), max_size=6).map(tuple)


@given(_pod)
def test_decode_of_encode_gives_the_containers_plus_hamis_trailing_empty_entry(
    pod: tuple[tuple[ContainerDevice, ...], ...],
) -> None:
    decoded = decode_pod_devices(encode_pod_devices(pod))
    assert decoded == (*pod, ())  # an empty pod encodes to "", which HAMi decodes to one empty container


@given(st.text(max_size=200))
def test_arbitrary_text_decodes_or_raises_annotation_error(value: str) -> None:
    try:
        decoded = decode_pod_devices(value)
    except AnnotationError as err:
        key = err.key
        assert key == DEVICES_TO_ALLOCATE
        return
    for container in decoded:
        for device in container:
            assert device.usedmem >= 0
            assert device.usedcores >= 0
