"""One Huawei Ascend chip model as a device family (hami-vendors §1): the port of :mod:`hami_common.vendors._family`.

Each ``vnpus.configs[]`` entry is its own backend, known by its common word (``Ascend910B3``): its own
resources, register and handshake annotations, pod keys and Fit. All of them share HAMi's node lock
``hami.io/mutex.lock``.

**Type matching, HAMi's and ours.** HAMi hands a request to the cards whose type contains the request type,
case-insensitively (``HAMi: pkg/scheduler/score.go:43-52``), and Ascend's ``checkType`` then compares only
the request with the common word, never the card. So an ``Ascend910B4`` pod can be placed on
``Ascend910B4-1`` NPUs, a different chip with twice the memory and other templates. We keep HAMi's selection
for :meth:`AscendFamily.owns` (the 910B4 backend still *sees* 910B4-1 cards, and says why it refuses them)
but the Fit requires the card type to equal the common word exactly: such a card is ``CardTypeMismatch``.

**The node's vNPU mode.** HAMi's Fit reads the Node's ``hami-vnpu-core`` annotation (or, absent, the global
``hamiVnpuCore``). We read it once, at :meth:`AscendFamily.node_devices`, into each card's
``DeviceUsage.mode``: ``hami-core`` when the node runs the soft split, ``template`` otherwise. The pod's
``huawei.com/vnpu-mode`` reaches the Fit through :meth:`AscendFamily.preferences` as
``PodPreferences.vgpu_mode`` (the pod's requested sharing mode for the family being fitted).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import msgspec

from hami_common.annotations.devices import ContainerDevice, decode_pod_devices, encode_pod_devices
from hami_common.annotations.keys import NODE_LOCK, VGPU_TIME
from hami_common.resources import ContainerResources, DeviceRequest
from hami_common.scheduling.policy import PodPreferences
from hami_common.scheduling.usage import DeviceUsage, NodeUsage
from hami_common.scheduling.vendor import ContainerFit, FitContext
from hami_common.vendors._common import check_quantities, family_preferences
from hami_common.vendors._family import Admission, NodeLockSpec, NodeView, QuotaSpec
from hami_common.vendors.ascend import keys
from hami_common.vendors.ascend.admission import admit, is_hami_core, parse_request, round_memory
from hami_common.vendors.ascend.config import AscendConfig, ChipConfig
from hami_common.vendors.ascend.fit import fit_npus, score_grouping
from hami_common.vendors.ascend.register import decode_register

__all__ = ["AscendFamily", "NpuRuntime", "families"]


class NpuRuntime(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename={"uuid": "UUID"}):
    """One entry of ``huawei.com/<CommonWord>``: HAMi's field order, every field omitempty."""

    uuid: str = ""
    temp: str = ""  # the hard-split template; none for a whole card or in hami-core mode
    memory: int = 0
    core: int = 0


_RUNTIME_ENCODER = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class AscendFamily:
    """The backend of one chip model. ``hami_vnpu_core`` is the mode of nodes without a ``hami-vnpu-core``
    annotation (``vnpus.hamiVnpuCore``)."""

    chip: ChipConfig
    hami_vnpu_core: bool = False

    @property
    def word(self) -> str:
        return self.chip.common_word

    @property
    def resource_names(self) -> tuple[str, ...]:
        c = self.chip
        return tuple(n for n in (c.resource_name, c.resource_memory_name, c.resource_core_name) if n)

    @property
    def handshake_key(self) -> str | None:
        return keys.handshake_key(self.word)

    @property
    def register_key(self) -> str | None:
        return keys.register_key(self.word)

    @property
    def node_lock(self) -> NodeLockSpec:
        return NodeLockSpec(key=NODE_LOCK, expiry=keys.LOCK_EXPIRY, shared=True)

    @property
    def quota(self) -> QuotaSpec:
        c = self.chip
        return QuotaSpec(
            memory_name=c.resource_memory_name,
            core_name=c.resource_core_name,
            memory_factor=c.memory_factor,
        )

    def owns(self, dev: DeviceUsage) -> bool:
        """HAMi's selection: the card type contains the common word (any case); see the module docstring."""
        return self.word.lower() in dev.type.lower()

    def preferences(self, base: PodPreferences, pod_annotations: Mapping[str, str]) -> PodPreferences:
        prefs = family_preferences(
            base,
            pod_annotations,
            use_uuid=keys.use_uuid_key(self.word),
            nouse_uuid=keys.nouse_uuid_key(self.word),
        )
        return replace(prefs, vgpu_mode=pod_annotations.get(keys.VNPU_MODE))

    def check(self, container: ContainerResources) -> None:
        check_quantities(container, self.resource_names, self.request)

    def admit(self, container: ContainerResources, pod_annotations: Mapping[str, str]) -> Admission:
        return admit(self.chip, container, pod_annotations)

    def request(self, container: ContainerResources) -> DeviceRequest | None:
        return parse_request(self.chip, container)

    def node_devices(self, node: NodeView) -> tuple[DeviceUsage, ...]:
        """The register annotation's NPUs, each carrying the node's vNPU mode and its HCCS NetworkID."""
        registered = decode_register(node.annotations.get(keys.register_key(self.word)), self.word)
        flag = node.annotations.get(keys.NODE_VNPU_CORE)
        soft = self.hami_vnpu_core if flag is None else flag == "true"
        mode = keys.MODE_HAMI_CORE if soft else keys.MODE_TEMPLATE
        return tuple(
            DeviceUsage(
                id=r.id,
                index=r.index,
                count=r.count,
                totalmem=r.devmem,
                totalcore=r.devcore,
                type=r.type,
                numa=r.numa,
                health=r.health,
                mode=mode,
                network_id=r.network_id,
            )
            for r in registered
        )

    def fit(self, devices: Sequence[DeviceUsage], request: DeviceRequest, ctx: FitContext) -> ContainerFit:
        return fit_npus(self.word, devices, request, ctx)

    def score_node(self, node: NodeUsage, picked: Sequence[Sequence[ContainerDevice]]) -> float:
        if not self.word.startswith(keys.ASCEND_910_PREFIX):
            return 0.0
        return score_grouping(node, picked)

    def pod_annotations(
        self, node: NodeUsage, picked: Sequence[Sequence[ContainerDevice]], pod_annotations: Mapping[str, str]
    ) -> Mapping[str, str]:
        """HAMi's ``PatchAnnotations``: the device lists, ``huawei.com/<CommonWord>`` and ``predicate-time``.

        ``predicate-time`` is HAMi's Filter time in Unix seconds, the same moment as ``hami.io/vgpu-time``;
        the core reads no clock, so it is copied from ``pod_annotations[hami.io/vgpu-time]`` (the caller
        passes the pod's annotations with the generic ones it is writing) and left out when that is absent.
        """
        if not any(picked):
            return {}
        soft = is_hami_core(pod_annotations)
        runtime = []
        for devices in picked:
            for dev in devices:
                rounded = None if soft else round_memory(self.chip, dev.usedmem)
                template = rounded.template if rounded is not None else None
                runtime.append(
                    NpuRuntime(
                        uuid=dev.uuid,
                        temp=template.name if template is not None else "",
                        memory=dev.usedmem,
                        core=dev.usedcores,
                    )
                )
        encoded = encode_pod_devices(picked)
        out = {
            keys.devices_to_allocate_key(self.word): encoded,
            keys.devices_allocated_key(self.word): encoded,
            keys.runtime_key(self.word): _RUNTIME_ENCODER.encode(runtime).decode(),
        }
        moment = pod_annotations.get(VGPU_TIME)
        if moment is not None:
            out[keys.PREDICATE_TIME] = moment
        return out

    @property
    def owned_annotations(self) -> frozenset[str]:
        return frozenset(
            {
                keys.devices_to_allocate_key(self.word),
                keys.devices_allocated_key(self.word),
                keys.runtime_key(self.word),
            }
        )

    @property
    def user_annotations(self) -> frozenset[str]:
        return frozenset({keys.use_uuid_key(self.word), keys.nouse_uuid_key(self.word), keys.VNPU_MODE})

    def allocated(self, pod_annotations: Mapping[str, str]) -> tuple[tuple[ContainerDevice, ...], ...]:
        key = keys.devices_allocated_key(self.word)
        value = pod_annotations.get(key)
        return decode_pod_devices(value, key) if value else ()


def families(config: AscendConfig) -> tuple[AscendFamily, ...]:
    """One family per configured chip model, or none unless the section is enabled (HAMi's --enable-ascend)."""
    if not config.enabled:
        return ()
    return tuple(AscendFamily(chip=chip, hami_vnpu_core=config.hami_vnpu_core) for chip in config.configs)
