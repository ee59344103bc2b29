"""Keys of structured log fields (``extra=``) shared by every service, so lines can be joined up."""

from __future__ import annotations

from typing import Final

POD_UID: Final = "pod_uid"
NAMESPACE: Final = "namespace"
POD: Final = "pod"
NODE: Final = "node"
DEVICE: Final = "device"
REASON: Final = "reason"
SUBJECT: Final = "subject"
