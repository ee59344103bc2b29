"""The webhook's edges to the rest of the system: NATS events (best effort), namespace labels, TLS rotation."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509

from hami_common import subjects
from hami_common.bus import Bus, Delivery, EmbeddedNats
from hami_common.envvars import CUDA_DISABLE_CONTROL
from hami_common.events import AdmissionEvent
from hami_common.resources import GPU
from hami_sim.waiting import eventually
from hami_webhook.admission import AdmissionPolicy
from hami_webhook.publisher import EventPublisher
from hami_webhook.reviewer import Reviewer
from tests.webhook.conftest import TlsFiles, cluster_settings, offline_settings
from tests.webhook.support import container, patched, pod, review, served, write_self_signed

DISABLE_CONTROL = [{"name": CUDA_DISABLE_CONTROL, "value": "true"}]


async def test_each_admission_is_announced_on_the_bus(bus: Bus, nats_server: EmbeddedNats, tls_files: TlsFiles) -> None:
    received: asyncio.Queue[tuple[AdmissionEvent, Delivery]] = asyncio.Queue()

    async def on_admission(event: AdmissionEvent, delivery: Delivery) -> None:
        await received.put((event, delivery))

    await bus.subscribe(subjects.wildcard(subjects.ADMISSION), AdmissionEvent, on_admission)
    probe = AdmissionEvent(pod_uid="probe", namespace="probe", name="probe", allowed=True, at_ns=0)
    await bus.publish(subjects.admission("probe"), probe)  # its return proves the subscription is in place
    assert (await asyncio.wait_for(received.get(), 10))[0] == probe
    settings = offline_settings(tls_files, publish_events=True, nats_url=nats_server.url)
    with served(settings, tls_files.cert) as webhook:
        await asyncio.to_thread(webhook.admit, review(pod(container(limits={GPU: "1"}), namespace="team-a")))
        await asyncio.to_thread(
            webhook.admit, review(pod(container(limits={GPU: "1"}), node_name="n", namespace="team-b"))
        )
        first, first_delivery = await asyncio.wait_for(received.get(), 10)
        second, _ = await asyncio.wait_for(received.get(), 10)
    assert first_delivery.subject == subjects.admission("team-a")
    assert (first.namespace, first.name, first.allowed, first.mutated, first.gpu_containers) == (
        "team-a",
        "gpu-pod",
        True,
        True,
        1,
    )
    assert (second.namespace, second.allowed, second.reason) == ("team-b", False, "pod has node assigned")


def test_admission_does_not_need_nats(tls_files: TlsFiles) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        nowhere = f"nats://127.0.0.1:{unused.getsockname()[1]}"
    settings = offline_settings(tls_files, publish_events=True, nats_url=nowhere, nats_connect_timeout=0.2)
    with served(settings, tls_files.cert) as webhook:
        for _ in range(20):
            assert webhook.admit(review(pod(container(limits={GPU: "1"}))))["allowed"] is True


async def test_events_beyond_the_queue_are_dropped_not_waited_for() -> None:
    publisher = EventPublisher(capacity=2)
    event = AdmissionEvent(pod_uid="u", namespace="ns", name="p", allowed=True, at_ns=1)
    for _ in range(5):
        publisher.offer(subjects.admission("ns"), event)
    assert publisher.dropped == 3


async def test_a_dry_run_is_judged_but_not_announced() -> None:
    publisher = EventPublisher()
    reviewer = Reviewer(AdmissionPolicy(), events=publisher)
    dry = review(pod(container(limits={GPU: "1"})))
    dry["request"]["dryRun"] = True
    status, _ = reviewer.review(json.dumps(dry).encode())
    assert (status, publisher.queued) == (200, 0)
    dry["request"]["dryRun"] = False
    reviewer.review(json.dumps(dry).encode())
    assert publisher.queued == 1


@pytest.mark.parametrize(
    ("rule", "labels", "kept"),
    [
        ("hami.io/allow-disable-control", {"hami.io/allow-disable-control": "yes"}, True),
        ("gpu/enforcement=off", {"gpu/enforcement": "off"}, True),
        ("gpu/enforcement=off", {"gpu/enforcement": "on"}, False),
        ("gpu/enforcement=off", {}, False),
    ],
    ids=["label present", "label with the value", "label with another value", "no label"],
)
async def test_cuda_disable_control_is_kept_only_in_namespaces_with_the_label(
    core: Any, kubeconfig: Path, tls_files: TlsFiles, rule: str, labels: dict[str, str], kept: bool
) -> None:
    core.create_namespace({"metadata": {"name": "team-a", "labels": labels}})
    settings = cluster_settings(tls_files, kubeconfig, disable_control_label=rule)
    original = pod(container(limits={GPU: "1"}, env=DISABLE_CONTROL), namespace="team-a")
    with served(settings, tls_files.cert) as webhook:
        await eventually(
            lambda: asyncio.to_thread(lambda: webhook.client.get(webhook.url + "/readyz").status_code == 200),
            what="caches synced",
        )
        result = await asyncio.to_thread(lambda: patched(original, webhook.admit(review(original))))
    assert (result["spec"]["containers"][0].get("env") == DISABLE_CONTROL) is kept


def served_serial(port: int) -> int:
    """The serial number of the certificate the server presents now (read, not verified)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with (
        socket.create_connection(("127.0.0.1", port)) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


async def test_a_rotated_certificate_is_served_without_a_restart(tmp_path: Path) -> None:
    files = TlsFiles(tmp_path / "tls.crt", tmp_path / "tls.key")
    first = write_self_signed(files.cert, files.key)
    settings = offline_settings(files, tls_reload_seconds=0.05)
    with served(settings, files.cert) as webhook:
        port = int(webhook.url.rsplit(":", 1)[1])
        assert await asyncio.to_thread(served_serial, port) == first
        staged = TlsFiles(tmp_path / "new.crt", tmp_path / "new.key")
        second = write_self_signed(staged.cert, staged.key)
        staged.key.replace(files.key)
        staged.cert.replace(files.cert)

        async def rotated() -> bool:
            return await asyncio.to_thread(served_serial, port) == second

        await eventually(rotated, what="new certificate served")
        verify = ssl.create_default_context(cafile=str(files.cert))
        async with httpx.AsyncClient(verify=verify) as fresh:
            answer = await fresh.post(webhook.url + "/webhook", json=review(pod()))
    assert answer.status_code == 200
    assert answer.json()["response"]["allowed"] is True


def test_without_the_apiserver_admission_answers_but_readiness_says_no(tmp_path: Path, tls_files: TlsFiles) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{unused.getsockname()[1]}"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "gone", "cluster": {"server": nowhere}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "gone", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    with served(cluster_settings(tls_files, kubeconfig), tls_files.cert) as webhook:
        assert webhook.client.get(webhook.url + "/readyz").status_code == 503
        assert webhook.client.get(webhook.url + "/healthz").status_code == 200
        original = pod(container(limits={GPU: "1"}))
        assert patched(original, webhook.admit(review(original)))["spec"]["schedulerName"] == "hami-scheduler"
