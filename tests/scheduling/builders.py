"""Small builders for engine tests: cards, nodes, requests, preferences."""

from __future__ import annotations

from typing import Any

from hami_common.annotations.keys import NVIDIA_VENDOR
from hami_common.resources import UNSET_PERCENTAGE, DeviceRequest, PodRequest
from hami_common.scheduling import DeviceUsage, FitContext, NodeUsage, PodPreferences


def card(id: str, **kw: Any) -> DeviceUsage:
    fields: dict[str, Any] = {
        "index": 0,
        "count": 100,
        "totalmem": 1280,
        "totalcore": 100,
        "type": NVIDIA_VENDOR,
        "numa": 0,
        "health": True,
    }
    fields.update(kw)
    return DeviceUsage(id=id, **fields)


def request(nums: int = 1, memreq: int = 512, pct: int = 0, cores: int = 0, type: str = NVIDIA_VENDOR) -> DeviceRequest:
    return DeviceRequest(nums=nums, memreq=memreq, mem_percentage=pct, coresreq=cores, type=type)


def mib(nums: int, memreq: int, cores: int = 0) -> DeviceRequest:
    """A request in MiB, as the webhook's parsing produces it (percentage unset)."""
    return DeviceRequest(nums=nums, memreq=memreq, mem_percentage=UNSET_PERCENTAGE, coresreq=cores)


def node(name: str, *devices: DeviceUsage, **kw: Any) -> NodeUsage:
    return NodeUsage(name=name, devices=tuple(devices), **kw)


def ctx(n: NodeUsage | None = None, **prefs: Any) -> FitContext:
    return FitContext(prefs=PodPreferences(**prefs), node=n or node("n"))


def pod(*app: DeviceRequest | None, init: tuple[DeviceRequest | None, ...] = ()) -> PodRequest:
    return PodRequest(init=init, app=tuple(app))
