"""The ValidatingAdmissionPolicies of deploy/kustomize/base/policies, as every overlay deploys them: the keys and
accounts their CEL names are the ones the code names (tests/realk8s/test_admission_policies.py runs them in
the real kube-apiserver)."""

from __future__ import annotations

import re
from typing import Any

from hami_common.annotations import GRANT_OWNED, SCHEDULER_OWNED, SCHEDULER_OWNED_LABELS, TRACE_CONTEXT
from hami_webhook.settings import DEFAULT_SYSTEM_USERS
from tests.deploy.families import shipped_families
from tests.deploy.manifests import Rendering

Obj = dict[str, Any]


def _strings(expression: str) -> set[str]:
    return set(re.findall(r"'([^']*)'", expression))


def _variable(policy: Obj, name: str) -> str:
    (found,) = [v["expression"] for v in policy["spec"]["variables"] if v["name"] == name]
    return str(found)


def test_every_overlay_binds_both_policies_in_deny_mode(overlay: Rendering) -> None:
    for name in ("hami-scheduler-owned", "hami-node-restriction"):
        policy = overlay.get("ValidatingAdmissionPolicy", name)
        assert policy["spec"]["failurePolicy"] == "Fail"
        binding = overlay.get("ValidatingAdmissionPolicyBinding", name)
        assert binding["spec"]["policyName"] == name
        assert binding["spec"]["validationActions"] == ["Deny"]


def test_the_guarded_keys_are_the_scheduler_owned_ones_but_the_webhooks_trace_context(overlay: Rendering) -> None:
    policy = overlay.get("ValidatingAdmissionPolicy", "hami-scheduler-owned")
    vendors = {key for shipped in shipped_families() for key in shipped.family.owned_annotations}
    assert _strings(_variable(policy, "annotations")) == set(GRANT_OWNED) | vendors
    assert _strings(_variable(policy, "labels")) == set(SCHEDULER_OWNED_LABELS)
    assert set(GRANT_OWNED) | {TRACE_CONTEXT} == set(SCHEDULER_OWNED)


def test_the_exempt_accounts_are_the_webhooks_system_users(overlay: Rendering) -> None:
    policy = overlay.get("ValidatingAdmissionPolicy", "hami-scheduler-owned")
    (condition,) = policy["spec"]["matchConditions"]
    assert _strings(condition["expression"]) == set(DEFAULT_SYSTEM_USERS)
    restriction = overlay.get("ValidatingAdmissionPolicy", "hami-node-restriction")
    (node_condition,) = restriction["spec"]["matchConditions"]
    node_account = {u for u in DEFAULT_SYSTEM_USERS if u.endswith(":hami-node")}
    assert _strings(node_condition["expression"]) == node_account
    rules = restriction["spec"]["matchConstraints"]["resourceRules"]
    assert {"pods", "nodes"} <= {r for rule in rules for r in rule["resources"]}
