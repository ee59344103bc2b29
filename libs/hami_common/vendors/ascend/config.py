"""HAMi's ``vnpus`` device-config section: one entry per Ascend chip model, with the chart's seven defaults.

Schema: ``HAMi: pkg/device/ascend/vnpu.go:19-48`` (hami-vendors §1.1). ``enabled`` is ours: HAMi builds its
Ascend backends only under ``--enable-ascend``, which the chart passes when ``devices.ascend.enabled`` is
true (default false), so the section is off unless it says ``enabled: true``. :func:`parse_vnpus` is pure:
the section as YAML decoded it in, an :class:`AscendConfig` out, or :class:`InvalidInput` naming the key.
"""

from __future__ import annotations

import re
from typing import Final

import msgspec

from hami_common.errors import InvalidInput
from hami_common.vendors.ascend.keys import ASCEND_910C

__all__ = ["CHART_CHIPS", "VNPUS_SECTION", "AscendConfig", "ChipConfig", "Template", "parse_vnpus"]

VNPUS_SECTION: Final = "vnpus"
_RESOURCE_NAME: Final = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_INT32_MAX: Final = 2**31 - 1


class Template(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    forbid_unknown_fields=True,
    rename={"ai_core": "aiCore", "ai_cpu": "aiCPU"},
):
    """A hard-split vNPU shape. The scheduler reads only ``name`` and ``memory``; the AI core and CPU
    counts are for the device plugin and the Ascend runtime, which carve the vNPU."""

    name: str
    memory: int  # MiB
    ai_core: int = 0
    ai_cpu: int = 0


class ChipConfig(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    forbid_unknown_fields=True,
    rename={
        "common_word": "commonWord",
        "chip_name": "chipName",
        "resource_name": "resourceName",
        "resource_memory_name": "resourceMemoryName",
        "resource_core_name": "resourceCoreName",
        "memory_allocatable": "memoryAllocatable",
        "memory_capacity": "memoryCapacity",
        "memory_factor": "memoryFactor",
        "ai_core": "aiCore",
        "ai_cpu": "aiCPU",
        "super_pod": "superPod",
        "runtime_class_name": "runtimeClassName",
        "overwrite_env": "overwriteEnv",
    },
):
    """One ``configs[]`` entry: one chip model, one backend."""

    common_word: str
    chip_name: str = ""  # matched by the device plugin against the DCMI chip name; unused by the scheduler
    resource_name: str = ""
    resource_memory_name: str = ""
    resource_core_name: str = ""  # empty: no core resource (HAMi's built-in fallback config)
    memory_allocatable: int = 0  # MiB one whole NPU gives a pod
    memory_capacity: int = 0  # MiB above which a request is refused
    memory_factor: int = 1  # the memory resource's unit in MiB; applied only when > 1, as HAMi does
    ai_core: int = 0
    ai_cpu: int = 0
    templates: tuple[Template, ...] = ()
    super_pod: bool = False
    runtime_class_name: str = ""
    overwrite_env: bool = False

    @property
    def templates_by_memory(self) -> tuple[Template, ...]:
        """Smallest first, as HAMi sorts them at start-up: rounding takes the first that fits."""
        return tuple(sorted(self.templates, key=lambda t: t.memory))


def _chart_chip(
    chip: str, word: str, allocatable: int, capacity: int, core: int, cpu: int, templates: tuple[Template, ...]
) -> ChipConfig:
    return ChipConfig(
        chip_name=chip,
        common_word=word,
        resource_name=f"huawei.com/{word}",
        resource_memory_name=f"huawei.com/{word}-memory",
        resource_core_name=f"huawei.com/{word}-core",
        memory_allocatable=allocatable,
        memory_capacity=capacity,
        ai_core=core,
        ai_cpu=cpu,
        templates=templates,
        super_pod=word == ASCEND_910C,
    )


def _t(name: str, memory: int, core: int, cpu: int = 0) -> Template:
    return Template(name=name, memory=memory, ai_core=core, ai_cpu=cpu)


_B3_TEMPLATES: Final = (_t("vir05_1c_16g", 16384, 5, 1), _t("vir10_3c_32g", 32768, 10, 3))

# The chart's device-configmap (HAMi: charts/hami/templates/scheduler/device-configmap.yaml:114-274).
CHART_CHIPS: Final[tuple[ChipConfig, ...]] = (
    _chart_chip(
        "910A",
        "Ascend910A",
        32768,
        32768,
        30,
        0,
        (_t("vir02", 2184, 2), _t("vir04", 4369, 4), _t("vir08", 8738, 8), _t("vir16", 17476, 16)),
    ),
    _chart_chip(
        "910B2",
        "Ascend910B2",
        65536,
        65536,
        24,
        6,
        (_t("vir03_1c_8g", 8192, 3, 1), _t("vir06_1c_16g", 16384, 6, 1), _t("vir12_3c_32g", 32768, 12, 3)),
    ),
    _chart_chip("910B3", "Ascend910B3", 65536, 65536, 20, 7, _B3_TEMPLATES),
    _chart_chip("910B4-1", "Ascend910B4-1", 65536, 65536, 20, 7, _B3_TEMPLATES),
    _chart_chip(
        "910B4", "Ascend910B4", 32768, 32768, 20, 7, (_t("vir05_1c_8g", 8192, 5, 1), _t("vir10_3c_16g", 16384, 10, 3))
    ),
    _chart_chip(
        "310P3",
        "Ascend310P",
        21527,
        24576,
        8,
        7,
        (_t("vir01", 3072, 1, 1), _t("vir02", 6144, 2, 2), _t("vir04", 12288, 4, 4)),
    ),
    _chart_chip("Ascend910", "Ascend910C", 65536, 65536, 20, 7, _B3_TEMPLATES),
)


class AscendConfig(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename={"hami_vnpu_core": "hamiVnpuCore"}
):
    """The ``vnpus`` section. ``hamiVnpuCore`` is what a node without a ``hami-vnpu-core`` annotation runs."""

    enabled: bool = False  # ours: HAMi's --enable-ascend (chart devices.ascend.enabled), off by default
    hami_vnpu_core: bool = False
    configs: tuple[ChipConfig, ...] = CHART_CHIPS


def _check_chip(i: int, chip: ChipConfig) -> None:
    where = f"{VNPUS_SECTION}.configs[{i}]"
    if not chip.common_word or any(c in chip.common_word for c in ",:; /"):
        raise InvalidInput(f"{where}.commonWord: {chip.common_word!r} is empty or holds one of ',:; /'")
    for key, name, required in (
        ("resourceName", chip.resource_name, True),
        ("resourceMemoryName", chip.resource_memory_name, True),
        ("resourceCoreName", chip.resource_core_name, False),
    ):
        if (name or required) and not _RESOURCE_NAME.match(name):
            raise InvalidInput(f"{where}.{key}: {name!r} is not an extended resource name (<domain>/<name>)")
    for key, number in (
        ("memoryAllocatable", chip.memory_allocatable),
        ("memoryCapacity", chip.memory_capacity),
        ("memoryFactor", chip.memory_factor),
    ):
        if not 0 <= number <= _INT32_MAX:
            raise InvalidInput(f"{where}.{key}: {number} is outside 0…{_INT32_MAX}")
    for j, template in enumerate(chip.templates):
        if not template.name or not 0 < template.memory <= _INT32_MAX:
            raise InvalidInput(f"{where}.templates[{j}]: needs a name and a memory in 1…{_INT32_MAX} MiB")


def parse_vnpus(raw: object) -> AscendConfig:
    """The ``vnpus`` section as YAML decoded it (``None`` when absent: the chart's defaults, disabled)."""
    if raw is None:
        return AscendConfig()
    try:
        config = msgspec.convert(raw, AscendConfig)
    except msgspec.ValidationError as err:
        text = str(err).replace("`$", f"`{VNPUS_SECTION}")
        raise InvalidInput(f"{VNPUS_SECTION}: {text}") from err
    words: set[str] = set()
    for i, chip in enumerate(config.configs):
        _check_chip(i, chip)
        if chip.common_word in words:
            raise InvalidInput(f"{VNPUS_SECTION}.configs[{i}].commonWord: {chip.common_word!r} appears twice")
        words.add(chip.common_word)
    return config
