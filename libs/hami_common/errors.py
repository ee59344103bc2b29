"""The one exception hierarchy of the project.

::

    HamiError
    ├── InvalidInput          malformed input from outside: a decoder, a request, a message
    │   ├── AnnotationError   a HAMi annotation value that does not follow its grammar
    │   └── Forbidden         the apiserver refused our identity or the request (401/403)
    ├── NotFound              the object asked for does not exist
    ├── Conflict              a write lost a race (stale resourceVersion, already bound)
    └── TransientError        worth retrying later: a peer is down or slow

Rejections and denials are values, never these exceptions (see STYLE.md §2). Each protocol edge maps
these types to its own error form in one place.
"""

from __future__ import annotations

__all__ = [
    "AnnotationError",
    "Conflict",
    "Forbidden",
    "HamiError",
    "InvalidInput",
    "NotFound",
    "TransientError",
]


class HamiError(Exception):
    """Root of every error this project raises on purpose."""


class InvalidInput(HamiError):
    """Input from outside the process is malformed; retrying the same input cannot help."""


class AnnotationError(InvalidInput):
    """An annotation value does not follow its grammar. The message always names the annotation."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"annotation {key}: {reason}")
        self.key = key
        self.reason = reason


class Forbidden(InvalidInput):
    """The apiserver refused who we are (401) or what we asked (403). Usually final; but a kube-apiserver that
    has just started answers 403 until its RBAC caches are filled, so a caller that must eventually succeed
    may wait it out."""


class NotFound(HamiError):
    """The object asked for does not exist."""


class Conflict(HamiError):
    """A write lost a race: a stale resourceVersion, a pod already bound, a lock held by another."""


class TransientError(HamiError):
    """A peer is unavailable or slow; the same request may succeed later."""

    def __init__(self, message: str, *, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after
