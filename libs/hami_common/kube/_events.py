"""Recording core/v1 Events about pods and nodes, as ``kubectl describe`` shows them."""

from __future__ import annotations

import datetime as dt
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Literal, Protocol

from hami_common.errors import HamiError
from hami_common.kube._types import Event, EventSource, ObjectMeta, ObjectReference

__all__ = ["EventPort", "EventRecorder", "EventType", "reference_to"]

log = logging.getLogger(__name__)

EventType = Literal["Normal", "Warning"]
_NAME_SUFFIX_BYTES: Final = 8


class EventPort(Protocol):
    async def create_event(self, event: Event) -> None: ...


class _Object(Protocol):
    @property
    def metadata(self) -> ObjectMeta: ...


def reference_to(obj: _Object, kind: str, api_version: str = "v1") -> ObjectReference:
    meta = obj.metadata
    return ObjectReference(
        api_version=api_version,
        kind=kind,
        namespace=meta.namespace,
        name=meta.name,
        uid=meta.uid,
        resource_version=meta.resource_version,
    )


def _timestamp(now: dt.datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(eq=False)
class EventRecorder:
    """``await recorder.record(ref, "Normal", "BindingSucceed", "...")``. Recording is best effort: a
    failure is logged, never raised, since an event must not fail the operation it describes."""

    port: EventPort
    component: str
    host: str = ""
    clock: Callable[[], dt.datetime] = field(default=lambda: dt.datetime.now(dt.UTC))

    def build(self, ref: ObjectReference, type_: EventType, reason: str, message: str) -> Event:
        stamp = _timestamp(self.clock())
        namespace = ref.namespace or "default"  # events about cluster-scoped objects live in "default"
        return Event(
            metadata=ObjectMeta(name=f"{ref.name}.{secrets.token_hex(_NAME_SUFFIX_BYTES)}", namespace=namespace),
            involved_object=ref,
            reason=reason,
            message=message,
            type=type_,
            first_timestamp=stamp,
            last_timestamp=stamp,
            source=EventSource(component=self.component, host=self.host),
            reporting_component=self.component,
            reporting_instance=self.host,
        )

    async def record(self, ref: ObjectReference, type_: EventType, reason: str, message: str) -> bool:
        """Create the event; return whether the apiserver took it."""
        try:
            await self.port.create_event(self.build(ref, type_, reason, message))
        except HamiError as err:
            log.warning("event %s about %s/%s not recorded: %s", reason, ref.namespace, ref.name, err)
            return False
        return True
