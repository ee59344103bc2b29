"""What the non-NVIDIA families share (hami-vendors §0.2): the Fit walk, the handshake verdict, request parsing.

HAMi's Ascend, Cambricon and Hygon backends each copy one Fit loop, one handshake rule and one way of
reading a container's resources; only a few steps differ per family. Those steps are parameters here, so a
family package is its keys, its codecs and a handful of calls into this module.

API (all pure):

* :func:`walk` runs §0.2 steps 1-12 over the cards, **from the end of the list**, and returns a
  :class:`Walk`: the passing cards as grants, in walk order, plus per-card rejection counts. It stops once
  ``request.nums`` cards passed, unless ``collect_all=True`` (Ascend's topology and 910C modes, which choose
  among every passing card themselves). Per-family hooks:

  - ``type_ok(dev)``: the family's ``checkType`` beyond the common substring match of the request type in
    the card type (Hygon's use/nouse-dcutype); default: none.
  - ``uuid_ok(dev)``: the use/nouse uuid check; :func:`uuid_allowed` over the family's own keys (read into
    ``ctx.prefs`` by :func:`family_preferences`) is the default.
  - ``quota_factor``: ``None`` skips step 8 (Ascend, Hygon); an int runs it with the quota's memory limit
    scaled by that factor (Cambricon's 256).
  - ``total_core(dev)``: the card's effective total core for steps 10-12 (Ascend's hami-core pods see 100).

* :meth:`Walk.finish` turns a walk into HAMi's verdict: the first ``nums`` grants, or
  ``AllocatedCardsInsufficientRequest`` counted as the number picked when some but too few passed.
  :func:`fit_walk` is ``walk(...).finish(nums)``, the whole Fit of Cambricon and Hygon.
* :func:`handshake_verdict`: the generic ``CheckHealth`` as ``(healthy, need_update, patch)``, where
  ``patch`` is the ``Requesting_<ts>`` value to write (or None); a family without a handshake key
  (Cambricon) is always ``(True, True, None)``: healthy, devices re-read every pass.
* :func:`add_resource_usage`: HAMi's ``AddResourceUsage`` (Used+1, Usedmem and Usedcores added).
* Config: :func:`decode_section` (a family's device-config section as its ``msgspec.Struct``) and
  :func:`check_resource_names`.
* Request parsing: :func:`count`, :func:`whole_number` (memory and cores with each family's range and
  fraction rule) and :func:`device_request` (HAMi's request struct: percentage 100 exactly when no memory).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final, TypeVar

import msgspec

from hami_common.annotations.devices import ContainerDevice, encode_pod_devices
from hami_common.annotations.handshake import check_handshake, encode_handshake
from hami_common.errors import InvalidInput
from hami_common.quantity import as_int
from hami_common.resources import INT32_MAX, ContainerResources, DeviceRequest, checked_whole
from hami_common.scheduling.policy import PodPreferences
from hami_common.scheduling.reason import Reason
from hami_common.scheduling.usage import DeviceUsage
from hami_common.scheduling.vendor import ContainerFit, FitContext

__all__ = [
    "FULL_CORES",
    "INT32_MAX",
    "SHARED_LOCK_EXPIRY",
    "HandshakeOutcome",
    "Walk",
    "add_resource_usage",
    "allocatable_count",
    "annotation_list",
    "check_quantities",
    "check_resource_names",
    "count",
    "decode_section",
    "device_lists",
    "device_request",
    "family_preferences",
    "fit_walk",
    "handshake_verdict",
    "type_filter",
    "uuid_allowed",
    "walk",
    "whole_number",
]

FULL_CORES: Final = 100
FULL_PERCENTAGE: Final = 100
# hami.io/mutex.lock, which Ascend and Hygon share with NVIDIA, counts as stale after five minutes (§2.7).
SHARED_LOCK_EXPIRY: Final = timedelta(minutes=5)


def device_lists(picked: Sequence[Sequence[ContainerDevice]], to_allocate: str, allocated: str) -> dict[str, str]:
    """The two copies of a placement's device list a family writes (``PatchAnnotations``): the one its device
    plugin consumes entry by entry, and the allocated record the scheduler and quota read back."""
    devices = encode_pod_devices(picked)
    return {to_allocate: devices, allocated: devices}


def check_quantities(
    container: ContainerResources, names: Sequence[str], request: Callable[[ContainerResources], object]
) -> None:
    """The webhook's quantity rule for a family without narrower ranges: each of ``names`` in the container's
    limits and requests a whole number from 0 to 2³¹-1 (:func:`~hami_common.resources.checked_whole`), then,
    where the container names any of them, its ``request`` read (a memory unit may push it out of range)."""
    for name in names:
        for source in (container.limits, container.requests):
            text = source.get(name)
            if text is not None:
                checked_whole(container.name, name, text)
    if any(name in container.limits or name in container.requests for name in names):
        request(container)


# --- preferences -------------------------------------------------------------------------------------------


def annotation_list(value: str | None) -> tuple[str, ...]:
    """A comma list from an annotation, items trimmed; empty or whitespace-only means no constraint."""
    if value is None:
        return ()
    return tuple(p.strip() for p in value.split(",") if p.strip())


def family_preferences(
    base: PodPreferences,
    annotations: Mapping[str, str],
    *,
    use_uuid: str,
    nouse_uuid: str,
    use_type: str | None = None,
    nouse_type: str | None = None,
) -> PodPreferences:
    """The pod's preferences with use/nouse read from this family's keys instead of NVIDIA's.

    The policy fields (mutex, node policy, weights) are HAMi's generic annotations and stay as in ``base``.
    A family without type annotations (Cambricon in v2.10, Ascend) passes no type keys: no type constraint.
    """
    return dataclasses.replace(
        base,
        use_uuids=annotation_list(annotations.get(use_uuid)),
        nouse_uuids=annotation_list(annotations.get(nouse_uuid)),
        use_types=annotation_list(annotations.get(use_type)) if use_type else (),
        nouse_types=annotation_list(annotations.get(nouse_type)) if nouse_type else (),
        vgpu_mode=None,  # nvidia.com/vgpu-mode is NVIDIA's
        numa_bind=False,  # checkType never asks NUMA for these families (§0.2): the NUMA step is dead code
    )


def uuid_allowed(dev: DeviceUsage, prefs: PodPreferences) -> bool:
    """HAMi's per-family ``CheckUUID``: a use list, when given, decides alone; else the nouse list."""
    if prefs.use_uuids:
        return dev.id in prefs.use_uuids
    return dev.id not in prefs.nouse_uuids


def type_filter(dev_type: str, use: Sequence[str], nouse: Sequence[str]) -> bool:
    """use/nouse type lists as case-insensitive substrings of the card type; empty lists constrain nothing."""
    model = dev_type.lower()
    if use and not any(t.lower() in model for t in use):
        return False
    return not any(t.lower() in model for t in nouse)


# --- the Fit walk ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Walk:
    """The cards that passed every check, in walk order (last card first), and why the others did not."""

    candidates: tuple[ContainerDevice, ...]
    rejected: Mapping[Reason, int] = field(default_factory=dict)
    checked: int = 0

    def finish(self, nums: int) -> ContainerFit:
        """HAMi's verdict: the first ``nums`` candidates, or the rejections plus, when some but too few
        passed, ``AllocatedCardsInsufficientRequest`` = number picked."""
        if nums > 0 and len(self.candidates) >= nums:
            return ContainerFit(devices=self.candidates[:nums], checked=self.checked)
        return self.fail()

    def fail(self, picked: int | None = None) -> ContainerFit:
        """A refusal; a partial pick (``picked`` cards, default every candidate) is counted as HAMi does."""
        reasons = Counter(self.rejected)
        n = len(self.candidates) if picked is None else picked
        if n:
            reasons[Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST] = n
        return ContainerFit(rejected=dict(reasons), checked=self.checked)


def _always(_: DeviceUsage) -> bool:
    return True


def _registered_core(dev: DeviceUsage) -> int:
    return dev.totalcore


def walk(
    devices: Sequence[DeviceUsage],
    request: DeviceRequest,
    ctx: FitContext,
    *,
    word: str,
    type_ok: Callable[[DeviceUsage], bool] = _always,
    uuid_ok: Callable[[DeviceUsage], bool] | None = None,
    quota_factor: int | None = None,
    total_core: Callable[[DeviceUsage], int] = _registered_core,
    collect_all: bool = False,
) -> Walk:
    """§0.2 steps 1-12 over ``devices`` from the end; grants carry ``word`` as their type (the list's TYPE).

    ``request`` is not changed: the clamp of cores to 100 (step 6) applies to the grants only.
    """
    uuid_check = uuid_ok if uuid_ok is not None else (lambda d: uuid_allowed(d, ctx.prefs))
    quota_ctx = None if quota_factor is None else dataclasses.replace(ctx, memory_factor=quota_factor)
    reasons: Counter[Reason] = Counter()
    picked: list[ContainerDevice] = []
    wanted = request.type.lower()
    cores = request.coresreq
    for dev in reversed(devices):
        if not collect_all and len(picked) >= request.nums:
            break
        if not dev.health:
            reasons[Reason.CARD_NOT_HEALTH] += 1
            continue
        if request.type != word or wanted not in dev.type.lower() or not type_ok(dev):
            reasons[Reason.CARD_TYPE_MISMATCH] += 1
            continue
        if not uuid_check(dev):
            reasons[Reason.CARD_UUID_MISMATCH] += 1
            continue
        if dev.count <= dev.used:
            reasons[Reason.CARD_TIME_SLICING_EXHAUSTED] += 1
            continue
        if ctx.prefs.mutex and dev.used > 0:
            reasons[Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT] += 1
            continue
        cores = min(cores, FULL_CORES)
        memreq = request.memory_on(dev.totalmem)
        grant = ContainerDevice(uuid=dev.id, type=word, usedmem=memreq, usedcores=cores)
        if quota_ctx is not None and not quota_ctx.quota_fits((*picked, grant)):
            reasons[Reason.RESOURCE_QUOTA_NOT_FIT] += 1
            continue
        if dev.totalmem - dev.usedmem < memreq:
            reasons[Reason.CARD_INSUFFICIENT_MEMORY] += 1
            continue
        total = total_core(dev)
        if total - dev.usedcores < cores:
            reasons[Reason.CARD_INSUFFICIENT_CORE] += 1
            continue
        if total == FULL_CORES and cores == FULL_CORES and dev.used > 0:
            reasons[Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT] += 1
            continue
        if total != 0 and dev.usedcores == total and cores == 0:
            reasons[Reason.CARD_COMPUTE_UNITS_EXHAUSTED] += 1
            continue
        picked.append(grant)
    return Walk(candidates=tuple(picked), rejected=dict(reasons), checked=len(devices))


def fit_walk(
    devices: Sequence[DeviceUsage],
    request: DeviceRequest,
    ctx: FitContext,
    *,
    word: str,
    type_ok: Callable[[DeviceUsage], bool] = _always,
    quota_factor: int | None = None,
) -> ContainerFit:
    """The whole Fit of a family with no placement choice of its own (Cambricon, Hygon)."""
    return walk(devices, request, ctx, word=word, type_ok=type_ok, quota_factor=quota_factor).finish(request.nums)


def add_resource_usage(dev: DeviceUsage, grant: ContainerDevice) -> DeviceUsage:
    """HAMi's ``AddResourceUsage`` for all three families: one more user, its memory and cores booked."""
    return dev.with_grant(grant.usedmem, grant.usedcores)


# --- handshake ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HandshakeOutcome:
    """The registration loop's verdict for one family on one node (§0.2)."""

    healthy: bool  # False: clean the node up and drop this family's devices there
    need_update: bool  # True: replace this family's device list with a fresh read
    patch: str | None = None  # the value to write to the handshake key, when one is due


def allocatable_count(allocatable: Mapping[str, str], resource: str) -> int:
    """The node's allocatable count of ``resource``; absent or unreadable counts as 0 (nothing to serve)."""
    text = allocatable.get(resource)
    if text is None:
        return 0
    try:
        number = as_int(text)
    except InvalidInput:
        return 0
    return number if number is not None else 0


def handshake_verdict(key: str | None, value: str | None, now: datetime, allocatable: int) -> HandshakeOutcome:
    """HAMi's generic ``CheckHealth`` (devices.go): ``Requesting`` within 60 s or allocatable > 0 is healthy;
    a value without ``Requesting`` (the plugin's ``Reported…``, or none) asks for a refresh and a new
    ``Requesting_<local time>``. ``now`` is the scheduler's local time. No key: always healthy and refreshed."""
    if key is None:
        return HandshakeOutcome(healthy=True, need_update=True)
    verdict = check_handshake(value, now, allocatable)
    patch = encode_handshake(now) if verdict.need_update else None
    return HandshakeOutcome(healthy=verdict.healthy, need_update=verdict.need_update, patch=patch)


# --- request parsing ---------------------------------------------------------------------------------------


def count(c: ContainerResources, resource: str) -> int | None:
    """The device count from limits, else requests; None when absent or 0 (not asking). A count that cannot
    be read (:func:`~hami_common.resources.checked_whole`) is ``InvalidInput``: never "not asking"."""
    text = c.quantity(resource)
    return None if text is None else checked_whole(c.name, resource, text) or None


def whole_number(c: ContainerResources, resource: str, *, scale: int = 1) -> int | None:
    """A memory or cores quantity from limits, else requests; None when absent (the family's default
    applies). ``scale``: what the value is multiplied by before it must fit HAMi's int32 (a memory factor or
    unit); one that cannot be read is ``InvalidInput`` naming the resource and the range."""
    text = c.quantity(resource)
    return None if text is None else checked_whole(c.name, resource, text, scale=scale)


def device_request(nums: int, word: str, memreq: int, cores: int) -> DeviceRequest:
    """HAMi's request struct for these families: percentage 100 (whole card) exactly when no memory is asked."""
    return DeviceRequest(
        nums=nums,
        memreq=memreq,
        mem_percentage=FULL_PERCENTAGE if memreq == 0 else 0,
        coresreq=cores,
        type=word,
    )


# --- config sections ---------------------------------------------------------------------------------------

S = TypeVar("S")


def decode_section(raw: object, tp: type[S], section: str) -> S:
    """A family's device-config section (already parsed YAML) as its Struct; InvalidInput names the key."""
    try:
        return msgspec.convert(raw, tp)
    except msgspec.ValidationError as err:
        text = str(err).replace("`$.", f"`{section}.").replace("`$`", f"`{section}`")
        raise InvalidInput(text if section in text else f"{text} in `{section}`") from err


def check_resource_names(section: str, names: Mapping[str, str]) -> None:
    """Each configured name is ``<domain>/<name>`` and no two share a name (InvalidInput naming the key)."""
    for key, name in names.items():
        domain, slash, rest = name.partition("/")
        if not slash or not domain or not rest or "/" in rest:
            raise InvalidInput(f"{section}.{key}: {name!r} is not an extended resource name (<domain>/<name>)")
    if len(set(names.values())) != len(names):
        raise InvalidInput(f"{section}: two resources share a name: {sorted(names.values())}")
