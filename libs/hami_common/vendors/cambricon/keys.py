"""Every Cambricon MLU name, once (hami-vendors §2): resource names, annotation keys, the common word.

Spelling of the "assigned" flag. HAMi renamed ``CAMBRICON_DSMLU_ASSIGHED`` to ``CAMBRICON_DSMLU_ASSIGNED``
in its v2.7.1 typo fix (commit ``5bce9ab7``), but Cambricon's device plugin (cambricon-k8s-device-plugin
v2.0.23) still reads the misspelt key and only serves a pod whose ``CAMBRICON_DSMLU_ASSIGHED`` is
``"false"``; it then writes ``"true"`` to that same key. We write **both** keys as ``"false"``: the misspelt
one so the published plugin finds the pod, the corrected one so tools that follow HAMi ≥ 2.7.1 see what
HAMi writes. Neither is ever read by us.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Final

MLU: Final = "MLU"  # common word, device type and the TYPE field of the device list

# Resource names: the chart's values (HAMi: charts/hami/values.yaml:31-34).
MLU_COUNT: Final = "cambricon.com/vmlu"  # HAMi-only: no device plugin registers it
MLU_MEMORY: Final = "cambricon.com/mlu.smlu.vmemory"  # units of MEMORY_UNIT MiB
MLU_CORES: Final = "cambricon.com/mlu.smlu.vcore"  # percent of one MLU

MEMORY_UNIT: Final = 256  # MiB per vmemory unit, hard-coded in HAMi (and the plugin's min-dsmlu-unit)

# Pod annotations written at placement.
DEVICES_TO_ALLOCATE: Final = "hami.io/cambricon-mlu-devices-to-allocate"
DEVICES_ALLOCATED: Final = "hami.io/cambricon-mlu-devices-allocated"
DSMLU_PROFILE: Final = "CAMBRICON_DSMLU_PROFILE"  # <index>_<cores>_<memory units>
DSMLU_ASSIGNED: Final = "CAMBRICON_DSMLU_ASSIGNED"  # HAMi's spelling since v2.7.1
DSMLU_ASSIGHED: Final = "CAMBRICON_DSMLU_ASSIGHED"  # the plugin's spelling (see the module docstring)
NOT_ASSIGNED: Final = "false"
DSMLU_PROFILE_INSTANCE: Final = "CAMBRICON_DSMLU_PROFILE_INSTANCE"  # <profileID>_<handle>_<slot>_<instanceID>

# User annotations. use/nouse-mlutype exist in HAMi but v2.10 ignores them (HAMi#2774): so do we.
USE_UUID: Final = "cambricon.com/use-gpuuuid"
NOUSE_UUID: Final = "cambricon.com/nouse-gpuuuid"
USE_MLUTYPE: Final = "cambricon.com/use-mlutype"
NOUSE_MLUTYPE: Final = "cambricon.com/nouse-mlutype"

# Cambricon's own node lock: a bare RFC 3339 time, not hami.io/mutex.lock.
NODE_LOCK: Final = "cambricon.com/dsmlu.lock"
LOCK_EXPIRY: Final = timedelta(minutes=2)

DEVICE_ID_INFIX: Final = "-cambricon-mlu-"  # invented card ids: <node>-cambricon-mlu-<i>
