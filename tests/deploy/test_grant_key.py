"""The grant key as every overlay deploys it: one generated Secret, read by the extender that signs grants and
by the allocator that verifies them, and by no other container (hami_common.grants)."""

from __future__ import annotations

import base64

from hami_common.grants import MIN_KEY_BYTES, GrantKey
from tests.deploy.manifests import Rendering, env_of

SIGNER_AND_VERIFIER = {("hami-scheduler", "extender"), ("hami-node", "allocator")}


def test_the_extender_and_the_allocator_read_the_same_generated_key(overlay: Rendering) -> None:
    secret = overlay.get("Secret", "hami-grant-key")
    key = GrantKey(base64.b64decode(secret["data"]["key"]).strip())
    assert len(key.secret) >= MIN_KEY_BYTES
    for workload, container in SIGNER_AND_VERIFIER:
        ref = overlay.container(workload, container)
        path = env_of(ref.container)["HAMI_GRANT_KEY_FILE"]["value"]
        volumes = {v["name"]: v for v in ref.pod_spec["volumes"]}
        mounts = [m for m in ref.container["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
        assert len(mounts) == 1, ref.where
        assert mounts[0].get("readOnly") is True, ref.where
        assert volumes[mounts[0]["name"]]["secret"]["secretName"] == secret["metadata"]["name"], ref.where
        assert path.rsplit("/", 1)[1] == "key"


def test_no_other_container_mounts_the_key(overlay: Rendering) -> None:
    secret = overlay.get("Secret", "hami-grant-key")["metadata"]["name"]
    for ref in overlay.containers():
        volumes = {v["name"]: v for v in ref.pod_spec.get("volumes") or []}
        mounted = {
            m["name"]
            for m in ref.container.get("volumeMounts") or []
            if volumes.get(m["name"], {}).get("secret", {}).get("secretName") == secret  # claims: not in volumes
        }
        key = (ref.workload["metadata"]["name"], ref.container["name"])
        assert bool(mounted) == (key in SIGNER_AND_VERIFIER), ref.where
