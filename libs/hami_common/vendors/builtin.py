"""The device families this project ships: importing a package registers it (see :mod:`.registry`)."""

from __future__ import annotations

from typing import Final

from hami_common.vendors import ascend, cambricon, hygon

__all__ = ["ORDER"]

# The order the shipped families are listed in (their devices after NVIDIA's, in the placement table, ...),
# whichever package was imported first.
ORDER: Final = (ascend.__name__, cambricon.__name__, hygon.__name__)
