"""HTTP paths of the extender API (k8s-interfaces §2.3: ``<urlPrefix>/<verb>``)."""

from __future__ import annotations

from typing import Final

FILTER: Final = "/filter"
BIND: Final = "/bind"
PRIORITIZE: Final = "/prioritize"
PREEMPT: Final = "/preempt"
HEALTHZ: Final = "/healthz"
READYZ: Final = "/readyz"
