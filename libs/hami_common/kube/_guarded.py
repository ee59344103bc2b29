"""Read-modify-write of annotations, guarded by resourceVersion and retried when another writer won."""

from __future__ import annotations

from collections.abc import Callable

from hami_common.kube._patches import AnnotationChanges
from hami_common.kube._ports import NodePatcher
from hami_common.kube._retry import Backoff, Retried, retry_on_conflict
from hami_common.kube._types import Node

__all__ = ["update_node_annotations"]


async def update_node_annotations(
    nodes: NodePatcher,
    name: str,
    changes: Callable[[Node], AnnotationChanges],
    *,
    attempts: int = 8,
    backoff: Backoff = Backoff(),  # noqa: B008 - frozen, so sharing the default is safe
) -> Retried[Node]:
    """Read the node, compute ``changes(node)`` from what it holds now, and patch with the node's
    resourceVersion; on 409 Conflict read again and recompute, up to ``attempts`` times."""

    async def read() -> Node:
        return await nodes.get_node(name)

    async def write(node: Node) -> Node:
        return await nodes.patch_node_annotations(name, changes(node), resource_version=node.metadata.resource_version)

    return await retry_on_conflict(read, write, attempts=attempts, backoff=backoff)
