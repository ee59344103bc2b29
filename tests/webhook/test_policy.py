"""The webhook's knobs (hami-protocol §1.2, §1.4), the trace start, through the reviewer in process."""

from __future__ import annotations

import json
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from hami_common.annotations import TRACE_CONTEXT
from hami_common.envvars import CUDA_DISABLE_CONTROL, GPU_CORE_UTILIZATION_POLICY, NVIDIA_VISIBLE_DEVICES
from hami_common.resources import GPU, GPU_MEMORY, ResourceConfig
from hami_webhook.admission import AdmissionPolicy, NamespaceState
from hami_webhook.reviewer import Reviewer
from tests.webhook.support import Json, container, patched, pod, response_of, review


def admitted(reviewer: Reviewer, original: Json) -> Json:
    status, body = reviewer.review(json.dumps(review(original)).encode())
    assert status == 200
    response = response_of(body)
    assert response["allowed"] is True, response
    return patched(original, response)


def test_overwrite_env_hides_gpus_from_containers_without_one() -> None:
    result = admitted(
        Reviewer(AdmissionPolicy(overwrite_env=True)), pod(container(limits={GPU: "1"}), container("log"))
    )
    assert "env" not in result["spec"]["containers"][0]
    assert result["spec"]["containers"][1]["env"] == [{"name": NVIDIA_VISIBLE_DEVICES, "value": "none"}]


@pytest.mark.parametrize("policy", ["force", "disable"])
def test_core_policy_reaches_every_container(policy: str) -> None:
    result = admitted(
        Reviewer(AdmissionPolicy(gpu_core_policy=policy)), pod(container(limits={GPU: "1"}), container("log"))
    )
    for ctr in result["spec"]["containers"]:
        assert ctr["env"] == [{"name": GPU_CORE_UTILIZATION_POLICY, "value": policy}]


def test_runtime_class_is_set_on_gpu_pods_that_have_none() -> None:
    reviewer = Reviewer(AdmissionPolicy(runtime_class_name="nvidia"))
    assert admitted(reviewer, pod(container(limits={GPU: "1"})))["spec"]["runtimeClassName"] == "nvidia"
    assert (
        admitted(reviewer, pod(container(limits={GPU: "1"}), runtime_class="kata"))["spec"]["runtimeClassName"]
        == "kata"
    )
    assert "runtimeClassName" not in admitted(reviewer, pod(container()))["spec"]


def test_default_scheduler_is_kept_when_overwriting_is_off() -> None:
    result = admitted(
        Reviewer(AdmissionPolicy(force_overwrite_default_scheduler=False)), pod(container(limits={GPU: "1"}))
    )
    assert result["spec"]["schedulerName"] == "default-scheduler"
    assert "nvidia.com/gpucores" not in result["spec"]["containers"][0]["resources"]["limits"]


def test_without_a_scheduler_name_the_pod_is_mutated_but_not_rerouted() -> None:
    result = admitted(Reviewer(AdmissionPolicy(scheduler_name="")), pod(container(limits={GPU: "1"}), node_name="n1"))
    assert result["spec"]["schedulerName"] == "default-scheduler"
    assert result["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpucores"] == "100"


def test_default_gpu_num_zero_leaves_memory_only_containers_alone() -> None:
    original = pod(container(limits={GPU_MEMORY: "3000"}))
    assert admitted(Reviewer(AdmissionPolicy(resources=ResourceConfig(default_gpu_num=0))), original) == original


class Allowing:
    def namespace(self, name: str) -> NamespaceState:
        return NamespaceState(may_disable_control=True)


def test_a_namespace_that_may_disable_control_keeps_cuda_disable_control() -> None:
    original = pod(container(limits={GPU: "1"}, env=[{"name": CUDA_DISABLE_CONTROL, "value": "true"}]))
    result = admitted(Reviewer(AdmissionPolicy(), namespaces=Allowing()), original)
    assert result["spec"]["containers"][0]["env"] == [{"name": CUDA_DISABLE_CONTROL, "value": "true"}]


def traced_reviewer() -> tuple[Reviewer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Reviewer(AdmissionPolicy(), tracer=provider.get_tracer("test")), exporter


def test_one_span_per_admission_and_the_gpu_pod_carries_its_trace() -> None:
    reviewer, exporter = traced_reviewer()
    result = admitted(reviewer, pod(container(limits={GPU: "1"})))
    [span] = exporter.get_finished_spans()
    assert span.name == "admission"
    traceparent = result["metadata"]["annotations"][TRACE_CONTEXT]
    version, trace_id, span_id, flags = traceparent.split("-")
    assert version == "00"
    assert int(flags, 16) & 1  # sampled
    assert int(trace_id, 16) == span.context.trace_id
    assert int(span_id, 16) == span.context.span_id


def test_the_apiservers_traceparent_becomes_the_parent() -> None:
    reviewer, exporter = traced_reviewer()
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    reviewer.review(json.dumps(review(pod(container(limits={GPU: "1"})))).encode(), {"traceparent": parent})
    [span] = exporter.get_finished_spans()
    assert span.context.trace_id == 0x4BF92F3577B34DA6A3CE929D0E0E4736
    assert span.parent is not None
    assert span.parent.span_id == 0x00F067AA0BA902B7


def test_pods_without_gpus_get_no_trace_annotation() -> None:
    reviewer, _ = traced_reviewer()
    original: Any = pod(container())
    assert admitted(reviewer, original) == original
