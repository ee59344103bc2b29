"""The overwrite-env component (deploy/kustomize/components/overwrite-env): HAMi's overwriteEnv turned on
together with the matchConditions that let it work (issue 28 item 5).

With the flag alone, a CPU-only pod whose image or spec sets NVIDIA_VISIBLE_DEVICES=all never reached the
webhook (base sends GPU pods and hami.io/ pods only), so it kept every GPU of its node under the NVIDIA
runtime. The real kube-apiserver twin is tests/realk8s/test_webhook_opt_out.py."""

from __future__ import annotations

from pathlib import Path
from typing import Final

import pytest

from tests.deploy.manifests import Rendering, env_of, render_with_component
from tests.deploy.test_webhook_conditions import container, gated, pod

CPU_POD_WITH_ALL_GPUS: Final = pod(
    [{**container({"cpu": "1"}), "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]
)


@pytest.mark.parametrize("base", ["dev", "production"])
def test_the_component_turns_the_flag_on_and_sends_every_pod_to_the_webhook(
    kubectl: str, deploy_tree: Path, renderings: dict[str, Rendering], base: str
) -> None:
    plain = renderings[base]
    assert not gated(plain, CPU_POD_WITH_ALL_GPUS), "base sends CPU pods to the webhook: the component is moot"
    assert "HAMI_OVERWRITE_ENV" not in env_of(plain.container("hami-webhook", "webhook").container)
    turned = render_with_component(deploy_tree, kubectl, base, "overwrite-env")
    webhook = turned.container("hami-webhook", "webhook").container
    assert env_of(webhook)["HAMI_OVERWRITE_ENV"]["value"] == "true"
    assert gated(turned, CPU_POD_WITH_ALL_GPUS)
    assert gated(turned, pod([{"name": "c", "image": "cuda:12"}]))  # the image's own env is invisible to CEL
    assert not gated(turned, CPU_POD_WITH_ALL_GPUS, namespace="kube-system")
    # nothing else changes: the namespace selector, the failure policy, every other object
    (before,) = plain.get("MutatingWebhookConfiguration", "hami-webhook")["webhooks"]
    (after,) = turned.get("MutatingWebhookConfiguration", "hami-webhook")["webhooks"]
    assert {k: v for k, v in after.items() if k != "matchConditions"} == {
        k: v for k, v in before.items() if k != "matchConditions"
    }
    assert [c["name"] for c in after["matchConditions"]] == ["not-kube-system", "not-an-update-by-hami"]
    kinds = ("Deployment", "MutatingWebhookConfiguration")
    assert [o for o in turned.objects if o["kind"] not in kinds] == [o for o in plain.objects if o["kind"] not in kinds]
