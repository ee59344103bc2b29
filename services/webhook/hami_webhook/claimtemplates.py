"""The DRA mode's one effect: the ResourceClaimTemplates an admitted pod names exist before it is stored.

Created while the apiserver waits for the answer, so a pod is never stored naming a template that could
not be written (the webhook refuses it instead, 500 with why). A template that exists already is taken as
it is: its name is the digest of its spec and a template's spec is immutable, so a namespace's pods asking
the same share it. Skipped on dry runs (the webhook is registered ``sideEffects: NoneOnDryRun`` in DRA mode).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import msgspec
from kubernetes import client

from hami_common.dra import ResourceClaimTemplate
from hami_common.errors import Conflict
from hami_common.kube import KubeClient

__all__ = ["KubeTemplates", "TemplateWriter"]


class TemplateWriter(Protocol):
    """Where the DRA mode's templates go (:class:`KubeTemplates`, or a test's recorder)."""

    async def ensure(self, templates: Sequence[ResourceClaimTemplate]) -> None:
        """Every template exists once this returns; raises a ``HamiError`` otherwise."""
        ...


class KubeTemplates:
    """Templates created on the apiserver through the project's one kube client."""

    def __init__(self, kube: KubeClient) -> None:
        self._kube = kube
        self._api = client.ResourceV1Api(kube.api_client)

    async def ensure(self, templates: Sequence[ResourceClaimTemplate]) -> None:
        for template in templates:
            meta = template.metadata
            body: dict[str, Any] = msgspec.to_builtins(template)
            what = f"resourceclaimtemplate {meta.namespace}/{meta.name}"
            create = self._api.create_namespaced_resource_claim_template
            try:
                await self._kube.call_raw(what, create, meta.namespace, body)
            except Conflict:
                continue  # AlreadyExists: the same name is the same spec
