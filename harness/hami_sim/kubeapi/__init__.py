"""An emulator of the part of the Kubernetes API this project uses, served over real HTTP.

The official ``kubernetes`` client and ``kubectl`` connect to it unchanged through the kubeconfig it
writes. See ``docs/kube-emulator.md`` for the emulated subset.
"""

from hami_sim.kubeapi._errors import ApiError
from hami_sim.kubeapi._patch import (
    PatchError,
    apply_json_patch,
    apply_merge_patch,
    apply_strategic_merge_patch,
)
from hami_sim.kubeapi._process import KubeApiProcess
from hami_sim.kubeapi._resources import RESOURCES, ResourceType
from hami_sim.kubeapi._resources import find as find_resource
from hami_sim.kubeapi._selectors import SelectorError, parse_field_selector, parse_label_selector
from hami_sim.kubeapi._server import KubeApiEmulator, kubeconfig_for, write_kubeconfig
from hami_sim.kubeapi._store import Store

__all__ = [
    "RESOURCES",
    "ApiError",
    "KubeApiEmulator",
    "KubeApiProcess",
    "PatchError",
    "ResourceType",
    "SelectorError",
    "Store",
    "apply_json_patch",
    "apply_merge_patch",
    "apply_strategic_merge_patch",
    "find_resource",
    "kubeconfig_for",
    "parse_field_selector",
    "parse_label_selector",
    "write_kubeconfig",
]
