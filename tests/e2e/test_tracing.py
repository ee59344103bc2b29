"""One pod, one trace: admission → filter → bind → placement → staging → Allocate, parent links intact.

The placement appears as the node agent's consumer span of ``hami.placement.<node>``, a child of the bind
span that published it (the extender records no separate publish span)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from hami_common import spans as names
from hami_common import subjects
from hami_common.annotations import TRACE_CONTEXT
from hami_sim.stack import LocalCluster
from hami_sim.stack.audit import gpu_pod
from hami_sim.waiting import eventually
from tests.e2e.conftest import stack_config


def ancestry(span: ReadableSpan, by_id: dict[int, ReadableSpan]) -> list[str]:
    """Names from ``span`` up to the root of its trace."""
    chain = [span.name]
    while span.parent is not None and span.parent.span_id in by_id:
        span = by_id[span.parent.span_id]
        chain.append(span.name)
    return chain


async def test_one_pod_yields_one_trace_from_admission_to_allocate(
    spans: InMemorySpanExporter, tmp_path: Path, sockdir: Path
) -> None:
    async with LocalCluster(stack_config(tmp_path, sockdir, nodes=1, gpus=2, node_hosts=0)) as cluster:
        created = await cluster.submit(gpu_pod("traced", mem=2000, cores=20))
        uid = created["metadata"]["uid"]
        async with asyncio.timeout(30):
            await cluster.wait_admitted([uid])
        pod = await cluster.kube.get_pod("default", "traced")

        traceparent = pod.metadata.annotations[TRACE_CONTEXT]
        trace_id = int(traceparent.split("-")[1], 16)

        def spans_of_pod() -> list[ReadableSpan] | None:
            found = [s for s in spans.get_finished_spans() if s.context.trace_id == trace_id]
            return found if names.ALLOCATE in {s.name for s in found} else None

        mine = await eventually(spans_of_pod, timeout=10, what="the Allocate span")

    by_id = {s.context.span_id: s for s in mine}
    by_name = {s.name: s for s in mine}
    placement = names.consume(subjects.placement(pod.spec.node_name))  # the node agent's span of the message
    roots = [s.name for s in mine if s.parent is None or s.parent.span_id not in by_id]
    assert roots == [names.ADMIT]
    assert ancestry(by_name[names.FILTER], by_id) == [names.FILTER, names.ADMIT]
    assert ancestry(by_name[names.ALLOCATE], by_id) == [names.ALLOCATE, names.STAGE, placement, names.BIND, names.ADMIT]
