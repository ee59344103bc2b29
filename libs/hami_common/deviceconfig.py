"""HAMi's ``device-config.yaml`` as it is: the chart's ConfigMap, parsed and validated (hami-protocol §1).

The file HAMi's chart mounts at ``/device-config.yaml`` has one section per vendor. The ``nvidia:`` section
gives the resource names, the scheduler-side knobs (``defaultMemory``, ``memoryFactor``, …) and the chart-wide
node values (``deviceSplitCount``, scaling, …); a ``nodeconfig`` list (HAMi's config.json shape, accepted at
the top level or inside ``nvidia:``) overrides them per node. :func:`parse_device_config` is pure: text in,
a :class:`DeviceConfig` out, or :class:`InvalidInput` naming the key that is wrong. The sections of
the families registered in :mod:`hami_common.vendors.registry` (``vnpus`` for Ascend, ``cambricon``,
``hygon``) enable those families, in ``families``; the sections of HAMi's other vendors, which this project
does not implement (AMD, MetaX, ...), are accepted and listed in ``ignored_sections`` (the caller logs them
once). :class:`DeviceConfigSettings` is the ``--device-config-file`` flag every service inherits; a service's
own flags, when given, win over the file.

Older and newer files load as HAMi loads them (HAMi's YAML decoder ignores keys it does not know). A key of the
``nvidia:`` section, or a section, that this project does not read is accepted with one warning naming it, in
``DeviceConfig.warnings`` (the settings log each once per load), with two exceptions that fail closed:

* a key that looks like a misspelling of one we read (``deviceSplitCout``, ``devicesplitcount``) is refused:
  ignoring it would leave the limit it meant to set at its default, which may be wider;
* ``knownMigGeometries`` (the chart's MIG key up to v2.9, replaced by ``migProfileAllowlist`` in v2.10, which
  HAMi does not derive from it) is read as the allowlist it implies: per entry, its models and the union of
  its geometries' profile names. Ignoring it would give those models every profile the GPU offers; HAMi's
  memory, count and core figures are not read (they come from the GPU). Where ``migProfileAllowlist`` is
  given too, it wins and ``knownMigGeometries`` is ignored.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

import msgspec
import yaml

from hami_common.errors import InvalidInput
from hami_common.inventory import MigAllowlist, NodeDeviceConfig
from hami_common.inventory._nodeconfig import NodeEntry, apply_node_entry, decode_node_entries, find_node_entry
from hami_common.resources import (
    GPU,
    GPU_CORES,
    GPU_MEMORY,
    GPU_MEMORY_PERCENTAGE,
    GPU_PRIORITY,
    ResourceConfig,
)
from hami_common.settings import setting
from hami_common.vendors import DeviceFamily
from hami_common.vendors.registry import configured, registered_sections

__all__ = [
    "CORE_POLICIES",
    "NODECONFIG",
    "NVIDIA_SECTION",
    "VENDOR_SECTIONS",
    "DeviceConfig",
    "DeviceConfigSettings",
    "MigAllowlist",
    "NodeConfigSettings",
    "overridden",
    "parse_device_config",
    "read_device_config",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

NVIDIA_SECTION: Final = "nvidia"
NODECONFIG: Final = "nodeconfig"
# The other sections of HAMi's Config (HAMi: pkg/scheduler/config/config.go:76-90, the chart's ConfigMap):
# accepted so the chart's file loads unchanged, ignored until those vendors are implemented.
VENDOR_SECTIONS: Final = frozenset(
    {
        "amd",
        "ascend",
        "awsneuron",
        "biren",
        "cambricon",
        "enflame",
        "hygon",
        "iluvatar",
        "iluvatars",
        "kunlun",
        "metax",
        "mthreads",
        "vastai",
        "vnpus",
    }
)
CORE_POLICIES: Final = ("default", "force", "disable")  # gpuCorePolicy (HAMi: pkg/device/nvidia/device.go:79-83)
_MIG_PROFILE: Final = re.compile(r"^[1-9][0-9]*g\..+$")  # HAMi: pkg/device/nvidia/mig_profiles.go:27-41
_RESOURCE_NAME: Final = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
# The chart's MIG key up to v2.9 (HAMi: charts/hami/templates/scheduler/device-configmap.yaml before v2.10):
# [{models: [...], allowedGeometries: [[{name, memory, count, core?}, ...], ...]}]
KNOWN_MIG_GEOMETRIES: Final = "knownMigGeometries"
_SIMILAR: Final = 0.8  # difflib ratio above which an unknown key reads as a misspelling of a known one


class _Nvidia(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    """The ``nvidia:`` section with HAMi's YAML keys and the chart's defaults (hami-protocol §1.1-1.2)."""

    resource_count_name: str = GPU
    resource_memory_name: str = GPU_MEMORY
    resource_memory_percentage_name: str = GPU_MEMORY_PERCENTAGE
    resource_core_name: str = GPU_CORES
    resource_priority_name: str = GPU_PRIORITY
    overwrite_env: bool = False
    default_memory: int = 0
    default_cores: int = 0
    default_gpu_num: int = msgspec.field(default=1, name="defaultGPUNum")
    memory_factor: int = 1
    device_split_count: int = 10
    device_memory_scaling: float = 1.0
    device_core_scaling: float = 1.0
    pre_configured_device_memory: int = 0
    enable_numa_topology: bool = False
    disable_core_limit: bool = False
    gpu_core_policy: str = "default"
    lib_cuda_log_level: int | str | None = None
    runtime_class_name: str = ""
    mig_profile_allowlist: tuple[MigAllowlist, ...] = ()
    nodeconfig: tuple[NodeEntry, ...] = ()


_NVIDIA_KEYS: Final = frozenset(f.encode_name for f in msgspec.structs.fields(_Nvidia))


class _MigTemplate(msgspec.Struct, frozen=True):
    """One template of a ``knownMigGeometries`` geometry; only the profile name is read."""

    name: str
    memory: int = 0
    count: int = 0
    core: int = 0


class _MigGeometries(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    """One ``knownMigGeometries`` entry (HAMi <= v2.9: ``AllowedMigGeometries``)."""

    models: tuple[str, ...] = ()
    allowed_geometries: tuple[tuple[_MigTemplate, ...], ...] = ()


@dataclass(frozen=True, slots=True)
class DeviceConfig:
    """The NVIDIA part of HAMi's device config; the defaults are the chart's (and this project's)."""

    resources: ResourceConfig = field(default_factory=ResourceConfig)
    node_defaults: NodeDeviceConfig = field(default_factory=NodeDeviceConfig)  # before a node's nodeconfig entry
    overwrite_env: bool = False
    gpu_core_policy: str = "default"
    runtime_class_name: str = ""
    disable_core_limit: bool = False
    mig_profile_allowlist: tuple[MigAllowlist, ...] = ()
    nodes: tuple[NodeEntry, ...] = ()
    ignored_sections: tuple[str, ...] = ()  # other vendors' sections, accepted and not applied
    families: tuple[DeviceFamily, ...] = ()  # the device families beside NVIDIA that the sections enable
    warnings: tuple[str, ...] = ()  # keys accepted but not applied as written, one line each (the caller logs)

    def for_node(self, node: str) -> NodeDeviceConfig:
        """What ``node``'s services apply: the chart-wide values with its ``nodeconfig`` entry on top."""
        entry = find_node_entry(self.nodes, node)
        return self.node_defaults if entry is None else apply_node_entry(self.node_defaults, entry)

    def with_nodes(self, entries: tuple[NodeEntry, ...]) -> DeviceConfig:
        """These entries (e.g. the device plugin's config.json) replace the file's own for the same nodes."""
        names = {e.name for e in entries}
        return dataclasses.replace(self, nodes=(*entries, *(e for e in self.nodes if e.name not in names)))


def _convert(raw: object, tp: type[Any], where: str) -> Any:
    try:
        return msgspec.convert(raw, tp)
    except msgspec.ValidationError as err:
        text = str(err)
        # msgspec says "... - at `$.deviceSplitCount`" or, for an unknown key, names it but not the section
        text = text.replace("`$.", f"`{where}.").replace("`$[", f"`{where}[").replace("`$`", f"`{where}`")
        raise InvalidInput(text if where in text else f"{text} in `{where}`") from err


def _check_nvidia(nv: _Nvidia) -> None:
    names = {
        "resourceCountName": nv.resource_count_name,
        "resourceMemoryName": nv.resource_memory_name,
        "resourceMemoryPercentageName": nv.resource_memory_percentage_name,
        "resourceCoreName": nv.resource_core_name,
        "resourcePriorityName": nv.resource_priority_name,
    }
    for key, name in names.items():
        if not _RESOURCE_NAME.match(name):
            raise InvalidInput(f"nvidia.{key}: {name!r} is not an extended resource name (<domain>/<name>)")
    if len(set(names.values())) != len(names):
        raise InvalidInput(f"nvidia: two resources share a name: {sorted(names.values())}")
    for key, number, low in (
        ("memoryFactor", nv.memory_factor, 1),
        ("defaultMemory", nv.default_memory, 0),
        ("defaultCores", nv.default_cores, 0),
        ("defaultGPUNum", nv.default_gpu_num, 0),
        ("preConfiguredDeviceMemory", nv.pre_configured_device_memory, 0),
    ):
        if number < low:
            raise InvalidInput(f"nvidia.{key}: {number} is below {low}")
    if nv.default_cores > 100:
        raise InvalidInput(f"nvidia.defaultCores: {nv.default_cores} is above 100 (a percentage of the card)")
    if nv.gpu_core_policy not in CORE_POLICIES:
        raise InvalidInput(f"nvidia.gpuCorePolicy: {nv.gpu_core_policy!r} is not one of {', '.join(CORE_POLICIES)}")
    for i, allowed in enumerate(nv.mig_profile_allowlist):
        if not allowed.models or not allowed.profiles:
            # HAMi refuses such an entry too (pkg/device/nvidia/mig_profiles.go): it would restrict nothing
            raise InvalidInput(f"nvidia.migProfileAllowlist[{i}]: an entry needs models and profiles")
        bad = [p for p in allowed.profiles if not _MIG_PROFILE.match(p)]
        if bad:
            raise InvalidInput(f"nvidia.migProfileAllowlist[{i}]: profile {bad[0]!r} is not '<N>g.<memory>'")


def _check_nodes(entries: tuple[NodeEntry, ...], base: NodeDeviceConfig) -> None:
    seen: set[str] = set()
    for entry in entries:
        if not entry.name:
            raise InvalidInput("nodeconfig: an entry has no name")
        if entry.name in seen:
            raise InvalidInput(f"nodeconfig: node {entry.name!r} has two entries")
        seen.add(entry.name)
        apply_node_entry(base, entry)  # refuses what that node could not apply, at start-up on every service


def _misspelt(key: str, known: frozenset[str]) -> str | None:
    """The known key ``key`` most likely misspells (other case, a letter off, a part of it), or None."""
    lowered = {k.lower(): k for k in known}
    word = key.lower()
    if word in lowered:
        return lowered[word]
    close = difflib.get_close_matches(word, list(lowered), n=1, cutoff=_SIMILAR)
    if close:
        return lowered[close[0]]
    if len(word) >= 4:
        contained = sorted(k for k in lowered if len(k) >= 4 and (word in k or k in word))
        if contained:
            return lowered[contained[0]]
    return None


def _unknown_key(where: str, key: str, applied: frozenset[str], kind: str = "key") -> str:
    """The warning for a key this project does not read; InvalidInput when it reads as a misspelling of one of
    ``applied`` (the keys whose values it applies)."""
    meant = _misspelt(key, applied)
    if meant is not None:
        raise InvalidInput(
            f"{where}{key}: unknown {kind}; did you mean {where}{meant}? (refused rather than ignored: what it "
            "meant to set would stay at its default)"
        )
    return f"{where}{key} is not a {kind} this project reads (nor HAMi v2.10); ignored"


def _allowlist_from_geometries(raw: object) -> tuple[MigAllowlist, ...]:
    """``knownMigGeometries`` as the allowlist it implies: per entry, its models and its profile names."""
    entries: tuple[_MigGeometries, ...] = _convert(
        raw, tuple[_MigGeometries, ...], f"{NVIDIA_SECTION}.{KNOWN_MIG_GEOMETRIES}"
    )
    allowlist: list[MigAllowlist] = []
    for i, entry in enumerate(entries):
        names = tuple(dict.fromkeys(t.name for geometry in entry.allowed_geometries for t in geometry))
        if not entry.models or not names:
            raise InvalidInput(
                f"{NVIDIA_SECTION}.{KNOWN_MIG_GEOMETRIES}[{i}]: an entry needs models and allowedGeometries "
                "(read as migProfileAllowlist, an entry without profiles would restrict nothing)"
            )
        bad = [n for n in names if not _MIG_PROFILE.match(n)]
        if bad:
            raise InvalidInput(
                f"{NVIDIA_SECTION}.{KNOWN_MIG_GEOMETRIES}[{i}]: profile {bad[0]!r} is not '<N>g.<memory>'"
            )
        allowlist.append(MigAllowlist(models=entry.models, profiles=names))
    return tuple(allowlist)


def _nvidia_section(raw: object) -> tuple[object, list[str]]:
    """The ``nvidia:`` keys this project reads, and a warning per key it accepts without reading as written."""
    if not raw:
        return {}, []
    if not isinstance(raw, Mapping):
        return raw, []  # not a mapping: the decoder names the wrong type
    section: dict[str, object] = {}
    warnings: list[str] = []
    where = f"{NVIDIA_SECTION}."
    for key, value in raw.items():
        name = str(key)
        if name in _NVIDIA_KEYS:
            section[name] = value
        elif name != KNOWN_MIG_GEOMETRIES:
            warnings.append(_unknown_key(where, name, _NVIDIA_KEYS))
    if KNOWN_MIG_GEOMETRIES in raw:
        geometries = raw[KNOWN_MIG_GEOMETRIES]
        allowlist_key = "migProfileAllowlist"
        if allowlist_key in section:
            warnings.append(
                f"{where}{KNOWN_MIG_GEOMETRIES} (HAMi <= v2.9) is ignored: {where}{allowlist_key} is given and wins"
            )
        elif not geometries:
            warnings.append(
                f"{where}{KNOWN_MIG_GEOMETRIES} (HAMi <= v2.9) is empty and ignored: without {where}{allowlist_key} "
                "a GPU in MIG mode registers every profile it offers"
            )
        else:
            allowlist = _allowlist_from_geometries(geometries)
            section[allowlist_key] = [msgspec.to_builtins(entry) for entry in allowlist]
            warnings.append(
                f"{where}{KNOWN_MIG_GEOMETRIES} (HAMi <= v2.9, replaced by {allowlist_key} in v2.10) is read as "
                f"{allowlist_key}: each entry's models may use only its geometries' profiles "
                f"({'; '.join(', '.join(e.profiles) for e in allowlist) or 'none'}); memory, count and core "
                "come from the GPU"
            )
    return section, warnings


def _sections(raw: Mapping[Any, object]) -> tuple[dict[str, object], list[str]]:
    """The top-level sections this project knows, and a warning per other one (a misspelt one is refused)."""
    applied = frozenset({NVIDIA_SECTION, NODECONFIG, *registered_sections()})
    sections: dict[str, object] = {}
    warnings: list[str] = []
    for key, value in raw.items():
        name = str(key)
        if name in applied or name in VENDOR_SECTIONS:
            sections[name] = value
        else:
            warnings.append(_unknown_key("", name, applied, kind="section"))
    return sections, warnings


def parse_device_config(text: str | bytes) -> DeviceConfig:
    """HAMi's device-config.yaml (or a config.json, JSON being YAML) as typed values; InvalidInput names the key."""
    try:
        return _parse(text)
    except RecursionError as err:  # the YAML reader and the decoders recurse per level of nesting
        raise InvalidInput("not a device config: nested too deeply") from err


def _parse(text: str | bytes) -> DeviceConfig:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise InvalidInput(f"not YAML: {err}") from err
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise InvalidInput(f"the top level must be a mapping of vendor sections, not {type(raw).__name__}")
    sections, warnings = _sections(raw)
    nvidia, nvidia_warnings = _nvidia_section(sections.get(NVIDIA_SECTION))
    warnings.extend(nvidia_warnings)
    nv: _Nvidia = _convert(nvidia, _Nvidia, NVIDIA_SECTION)
    top: tuple[NodeEntry, ...] = _convert(sections.get(NODECONFIG) or [], tuple[NodeEntry, ...], NODECONFIG)
    _check_nvidia(nv)
    level = nv.lib_cuda_log_level
    try:
        node_defaults = NodeDeviceConfig(
            split_count=nv.device_split_count,
            memory_scaling=nv.device_memory_scaling,
            core_scaling=nv.device_core_scaling,
            preconfigured_memory_mib=nv.pre_configured_device_memory,
            libcuda_log_level="" if level is None else str(level),
            numa_topology=nv.enable_numa_topology,
            mig_allowlist=nv.mig_profile_allowlist,
        )
    except InvalidInput as err:
        raise InvalidInput(f"nvidia: {err}") from err
    nodes = (*top, *nv.nodeconfig)
    _check_nodes(nodes, node_defaults)
    return DeviceConfig(
        resources=ResourceConfig(
            count_name=nv.resource_count_name,
            memory_name=nv.resource_memory_name,
            memory_percentage_name=nv.resource_memory_percentage_name,
            core_name=nv.resource_core_name,
            priority_name=nv.resource_priority_name,
            default_memory=nv.default_memory,
            default_cores=nv.default_cores,
            default_gpu_num=nv.default_gpu_num,
            memory_factor=nv.memory_factor,
        ),
        node_defaults=node_defaults,
        overwrite_env=nv.overwrite_env,
        gpu_core_policy=nv.gpu_core_policy,
        runtime_class_name=nv.runtime_class_name,
        disable_core_limit=nv.disable_core_limit,
        mig_profile_allowlist=nv.mig_profile_allowlist,
        nodes=nodes,
        ignored_sections=tuple(sorted(k for k in sections if k in VENDOR_SECTIONS and k not in registered_sections())),
        families=configured({k: v for k, v in sections.items() if k in VENDOR_SECTIONS}),
        warnings=tuple(warnings),
    )


def overridden(base: T, flags: Mapping[str, object]) -> T:
    """``base`` (a frozen dataclass) with every flag that was given: None means "not given", the file decides."""
    return dataclasses.replace(base, **{k: v for k, v in flags.items() if v is not None})  # type: ignore[type-var]


def read_device_config(path: str | Path) -> DeviceConfig:
    """The file at ``path`` parsed; every error names the file (and the key)."""
    try:
        text = Path(path).read_bytes()
    except OSError as err:
        raise InvalidInput(f"device config {path}: {err.strerror or err}") from err
    try:
        return parse_device_config(text)
    except InvalidInput as err:
        raise InvalidInput(f"device config {path}: {err}") from err


@dataclass(frozen=True)  # no slots: service settings combine bases by multiple inheritance
class DeviceConfigSettings:
    """``--device-config-file``: HAMi's device-config.yaml, read and validated once, when settings load."""

    device_config_file: str = setting(
        "", "HAMi's device-config.yaml (its chart's ConfigMap); flags given explicitly win over it (empty: defaults)"
    )

    def __post_init__(self) -> None:
        # read here so a bad file stops the service at start-up, with one line naming the key (exit 2)
        config = read_device_config(self.device_config_file) if self.device_config_file else DeviceConfig()
        for warning in config.warnings:  # one line per key, once per load
            log.warning("device config %s: %s", self.device_config_file, warning)
        if config.ignored_sections:
            log.info(
                "device config: sections %s are not applied (only %s is implemented)",
                ", ".join(config.ignored_sections),
                NVIDIA_SECTION,
            )
        object.__setattr__(self, "_device_config", config)  # not a field: no flag, not compared

    def device_config(self) -> DeviceConfig:
        config: DeviceConfig = self.__dict__["_device_config"]
        return config


@dataclass(frozen=True)  # no slots, as above
class NodeConfigSettings(DeviceConfigSettings):
    """The node services' view: the device config plus the device plugin's config.json, for one node.

    The allocator and the node agent both inherit this, so the split count a node registers and the devices
    the kubelet is told about come from the same entry (HAMi: the entry named like ``NODE_NAME``).
    """

    node_config_file: str = setting("", "HAMi's config.json with per-node overrides (nodeconfig); empty: none")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.node_config_file:
            try:
                text = Path(self.node_config_file).read_bytes()
            except OSError as err:
                raise InvalidInput(f"node config {self.node_config_file}: {err.strerror or err}") from err
            try:
                entries = decode_node_entries(text)
                device = self.device_config()
                _check_nodes(entries, device.node_defaults)
                device = device.with_nodes(entries)
            except InvalidInput as err:
                raise InvalidInput(f"node config {self.node_config_file}: {err}") from err
            object.__setattr__(self, "_device_config", device)

    def node_device_config(self, node: str, flags: Mapping[str, object]) -> NodeDeviceConfig:
        """``node``'s entry over the file's values, then every flag that was given (not None) on top."""
        try:
            return overridden(self.device_config().for_node(node), flags)
        except InvalidInput as err:
            raise InvalidInput(f"flags: {err}") from err
