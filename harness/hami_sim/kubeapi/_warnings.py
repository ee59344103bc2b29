"""Warnings for the client, as kube-apiserver sends them: one ``Warning: 299 - "<text>"`` header each.

The mutating admission dispatcher adds every text of a webhook's ``response.warnings`` to the request's
recorder (whether the webhook allowed the request or not); the recorder drops an empty text and one it has
seen, and writes the rest in order. A text that is not valid UTF-8 or holds a control character makes no
header. Past 4096 characters in all, every text is cut to 256 characters and the headers are written again
from the first, up to that total; kubectl prints each header as ``Warning: <text>``.
"""

from __future__ import annotations

import unicodedata
from typing import Final

__all__ = ["WARNING_HEADER", "WarningRecorder"]

WARNING_HEADER: Final = "Warning"
MISCELLANEOUS_PERSISTENT: Final = 299  # RFC 7234's warn-code for a persistent warning
TRUNCATE_AT_TOTAL: Final = 4 * 1024  # characters (Go runes) of warning text per response
TRUNCATE_ITEM: Final = 256  # characters of one text once the total is passed


def _header(text: str) -> str | None:
    """``299 - "<text>"`` with ``"`` and ``\\`` escaped; None where kube-apiserver refuses the text."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: not valid UTF-8
        return None
    if any(unicodedata.category(ch) == "Cc" for ch in text):
        return None
    quoted = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'{MISCELLANEOUS_PERSISTENT:03d} - "{quoted}"'


class WarningRecorder:
    """The warnings of one request, as header values in the order they go out."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._ordered: list[str] = []
        self._written = 0
        self._truncating = False
        self.headers: list[str] = []

    def add(self, text: str) -> None:
        if not text or text in self._seen or (self._truncating and self._written >= TRUNCATE_AT_TOTAL):
            return
        self._seen.add(text)
        self._ordered.append(text)
        shown = text[:TRUNCATE_ITEM] if self._truncating else text
        header = _header(shown)
        if header is None:
            return
        if self._truncating or self._written + len(shown) <= TRUNCATE_AT_TOTAL:
            self._written += len(shown)
            self.headers.append(header)
            return
        self._truncating = True
        self._written = 0
        self.headers = []
        for earlier in self._ordered:
            cut = earlier[:TRUNCATE_ITEM]
            again = _header(cut)
            if again is None:
                return
            self._written += len(cut)
            self.headers.append(again)
            if self._written >= TRUNCATE_AT_TOTAL:
                break

    def latin1(self) -> list[str]:
        """The header values as Starlette writes them (latin-1), so the UTF-8 bytes go out unchanged, as Go's."""
        return [value.encode("utf-8").decode("latin-1") for value in self.headers]
