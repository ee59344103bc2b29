"""Kubernetes versions (issue 18.7): the pre-1.30 component renders without what older apiservers reject,
and kube-scheduler's image follows the tag an overlay pins for its cluster."""

from __future__ import annotations

from pathlib import Path

from tests.deploy.manifests import Rendering, render

OLD_CLUSTER = """\
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../dev
components:
  - ../../components/pre-1.30
images:
  - name: registry.k8s.io/kube-scheduler
    newTag: v1.28.15
"""


def _scheduler_image(rendering: Rendering) -> str:
    image: str = next(c.container["image"] for c in rendering.containers() if c.container["name"] == "kube-scheduler")
    return image


def test_pre_1_30_component_drops_policies_and_match_conditions_and_pins_the_scheduler(
    kubectl: str, deploy_tree: Path, dev: Rendering
) -> None:
    overlay = deploy_tree / "kustomize" / "overlays" / "k8s-1.28"
    overlay.mkdir(exist_ok=True)
    (overlay / "kustomization.yaml").write_text(OLD_CLUSTER)
    old = render(overlay, kubectl)
    assert old.of_kind("ValidatingAdmissionPolicy") == old.of_kind("ValidatingAdmissionPolicyBinding") == []
    (webhook,) = old.of_kind("MutatingWebhookConfiguration")
    assert all("matchConditions" not in w for w in webhook["webhooks"])
    assert _scheduler_image(old) == "registry.k8s.io/kube-scheduler:v1.28.15"
    # everything else is the dev overlay's: same objects but the removed policies
    dropped = {("ValidatingAdmissionPolicy", 2), ("ValidatingAdmissionPolicyBinding", 2)}
    kinds = {(k, len(dev.of_kind(k))) for k in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")}
    assert kinds == dropped
    assert len(old.objects) == len(dev.objects) - 4


def test_default_overlays_keep_policies_and_match_conditions(overlay: Rendering) -> None:
    assert len(overlay.of_kind("ValidatingAdmissionPolicy")) == 2
    (webhook,) = overlay.of_kind("MutatingWebhookConfiguration")
    assert all(w.get("matchConditions") for w in webhook["webhooks"])
