"""The keys of the webhook's DRA mode (docs/dra.md): HAMi-DRA's pod label, and ours on the objects it writes."""

from __future__ import annotations

from typing import Final

__all__ = ["DRA_LABEL", "DRA_LABEL_ON", "DRA_SLICE_LABEL"]

# HAMi-DRA labels every pod its webhook translated (``hami.io/dra=true``); ours does the same, and labels the
# ResourceClaimTemplates it writes with it, so ``kubectl get resourceclaimtemplates -l hami.io/dra`` lists them.
DRA_LABEL: Final = "hami.io/dra"
DRA_LABEL_ON: Final = "true"
# Marks the ResourceSlices this project's node agent owns, so a publisher lists and removes only its own.
DRA_SLICE_LABEL: Final = "hami.io/dra-slice"
