"""The device families this project ships: importing a package registers it (see :mod:`.registry`)."""

from __future__ import annotations

import hami_common.vendors.ascend
import hami_common.vendors.cambricon
import hami_common.vendors.hygon  # noqa: F401

__all__: list[str] = []
