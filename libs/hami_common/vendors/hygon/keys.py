"""Every Hygon DCU name, once (hami-vendors §3): resource names, annotation keys, the common word."""

from __future__ import annotations

from typing import Final

DCU: Final = "DCU"  # common word, DeviceVendor and the TYPE field of the device list; cards are DCU-<model>

# Resource names: the chart's values (HAMi: charts/hami/values.yaml:36-39), served by Project-HAMi's
# dcu-vgpu-device-plugin (Hygon's own plugin serves hygon.com/dcu and does not work with HAMi).
DCU_COUNT: Final = "hygon.com/dcunum"
DCU_MEMORY: Final = "hygon.com/dcumem"
DCU_CORES: Final = "hygon.com/dcucores"

# Node annotations.
NODE_REGISTER: Final = "hami.io/node-dcu-register"  # the legacy colon form, written by dcu-dp
NODE_HANDSHAKE: Final = "hami.io/node-handshake-dcu"

# Pod annotations written at placement (no others).
DEVICES_TO_ALLOCATE: Final = "hami.io/dcu-devices-to-allocate"
DEVICES_ALLOCATED: Final = "hami.io/dcu-devices-allocated"

# User annotations.
USE_DCUTYPE: Final = "hygon.com/use-dcutype"
NOUSE_DCUTYPE: Final = "hygon.com/nouse-dcutype"
USE_UUID: Final = "hygon.com/use-gpuuuid"
NOUSE_UUID: Final = "hygon.com/nouse-gpuuuid"
