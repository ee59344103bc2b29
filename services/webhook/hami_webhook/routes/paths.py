"""The webhook's HTTP paths."""

from __future__ import annotations

from typing import Final

WEBHOOK: Final = "/webhook"
HEALTHZ: Final = "/healthz"
READYZ: Final = "/readyz"
