"""Forgetting: what the aggregator drops once it has gone quiet (hami_metrics.state explains the rules)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from hami_metrics.nodemap import NodeMap
from hami_metrics.schedpath import NS_PER_S, retire_namespaces
from hami_metrics.state import ClusterState, NodeState

__all__ = ["Retention", "expire"]


@dataclass(frozen=True, slots=True)
class Retention:
    node_staleness_ns: int
    usage_staleness_ns: int
    admission_horizon_ns: int
    admission_namespace_staleness_ns: int = 3600 * NS_PER_S


def expire(state: ClusterState, now_ns: int, retention: Retention) -> ClusterState:
    """Drop silent nodes, silent containers, old pod tombstones and admissions never bound; fold the admission
    counts of namespaces without an admission for a while into ``namespace="_other"``.

    Returns ``state`` itself when nothing is old enough, so callers can tell "unchanged" by identity.
    """
    node_cutoff = now_ns - retention.node_staleness_ns
    usage_cutoff = now_ns - retention.usage_staleness_ns
    nodes: list[tuple[str, NodeState]] = []
    changed = False
    expired = 0
    for name, node in state.nodes.items():
        if node.last_seen_ns < node_cutoff:
            expired += 1
            changed = True
            continue
        trimmed = _trim_node(node, usage_cutoff, node_cutoff)
        changed = changed or trimmed is not node
        nodes.append((name, trimmed))
    path = state.path
    admission_cutoff = now_ns - retention.admission_horizon_ns
    if any(p.seen_ns < admission_cutoff for p in path.pending_admissions.values()):
        kept = {uid: p for uid, p in path.pending_admissions.items() if p.seen_ns >= admission_cutoff}
        path = replace(path, pending_admissions=kept)
        changed = True
    retired = retire_namespaces(path, now_ns - retention.admission_namespace_staleness_ns)
    if retired is not path:
        path = retired
        changed = True
    if not changed:
        return state
    return replace(state, nodes=NodeMap(nodes), path=path, nodes_expired=state.nodes_expired + expired)


def _trim_node(node: NodeState, usage_cutoff: int, tombstone_cutoff: int) -> NodeState:
    stale_usage = any(u.seen_ns < usage_cutoff for u in node.usage.values())
    stale_host = any(h.seen_ns < usage_cutoff for h in node.host.values())
    old_ended = any(at < tombstone_cutoff for at in node.ended.values())
    if not (stale_usage or stale_host or old_ended):
        return node
    return replace(
        node,
        usage={k: u for k, u in node.usage.items() if u.seen_ns >= usage_cutoff} if stale_usage else node.usage,
        host={k: h for k, h in node.host.items() if h.seen_ns >= usage_cutoff} if stale_host else node.host,
        ended={uid: at for uid, at in node.ended.items() if at >= tombstone_cutoff} if old_ended else node.ended,
    )
