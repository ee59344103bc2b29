"""Every device family the project ships, as the registry knows them, with HAMi's chart defaults: what the
deployed manifests must name so that the apiserver and kube-scheduler route that family's pods to us.

Derived from :mod:`hami_common.vendors.registry` (each registered device-config section, enabled with its
chart defaults by its plugin module's ``FAKE_VENDOR``), never listed here, so a family added to the registry
that the manifests miss fails the deploy tests. NVIDIA is the ``nvidia:`` section's defaults
(:class:`hami_common.resources.ResourceConfig`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hami_common.inventory import Gpu
from hami_common.resources import ResourceConfig
from hami_common.vendors import DeviceFamily
from hami_common.vendors.plugin import fake_vendors, plugins
from hami_common.vendors.registry import configured, registered_sections

__all__ = ["ShippedFamily", "nvidia_resources", "shipped_families"]


@dataclass(frozen=True, slots=True)
class ShippedFamily:
    family: DeviceFamily
    advertised: frozenset[str]  # the resources its node's device plugin makes the kubelet report

    @property
    def word(self) -> str:
        return self.family.word


def nvidia_resources() -> Mapping[str, bool]:
    """NVIDIA's resource names -> whether the kubelet reports it (only the count, from the device plugin)."""
    names = ResourceConfig()
    return {
        names.count_name: True,
        names.memory_name: False,
        names.memory_percentage_name: False,
        names.core_name: False,
        names.priority_name: False,
    }


def shipped_families() -> tuple[ShippedFamily, ...]:
    """Every family of every registered section, enabled with the chart's defaults."""
    enabling = {fake.section: fake for fake in fake_vendors().values()}
    missing = sorted(registered_sections() - enabling.keys())
    assert not missing, f"registered sections without a chart-default enabling value: {missing}"
    found: list[ShippedFamily] = []
    for section, fake in enabling.items():
        families = configured({section: fake.enable})
        assert families, f"section {section} enables no family with {fake.enable}"
        by_word = {plugin.family.word: plugin for plugin in plugins(families)}
        device = Gpu(uuid=f"{fake.vendor}-0", index=0, model=fake.model, memory_mib=fake.memory_mib, vendor=fake.vendor)
        for family in families:
            assert family.word in by_word, f"{family.word}: no node plugin says what the kubelet advertises"
            advertised = frozenset(by_word[family.word].advertised("node", [device]))
            found.append(ShippedFamily(family, advertised))
    return tuple(found)
