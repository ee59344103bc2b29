"""The StorageClass patch docs/deploy.md ("Storage for NATS") tells operators to add renders as it says."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

from tests.deploy.manifests import REPO_ROOT, Rendering, render

DOC: Final = REPO_ROOT / "docs" / "deploy.md"
YAML_BLOCK: Final = re.compile(r"```yaml\n(.*?)```", re.DOTALL)


def documented_patch() -> str:
    section = DOC.read_text().split("## Storage for NATS", 1)[1].split("\n## ", 1)[0]
    blocks: list[str] = YAML_BLOCK.findall(section)
    (block,) = blocks
    return block


def test_the_claims_name_no_storage_class_so_the_default_one_serves_them(overlay: Rendering) -> None:
    (nats,) = overlay.of_kind("StatefulSet")
    (claim,) = nats["spec"]["volumeClaimTemplates"]
    assert "storageClassName" not in claim["spec"]


def test_the_documented_patch_names_the_class_of_the_nats_volumes(kubectl: str, deploy_tree: Path) -> None:
    for base in ("dev", "production"):
        folder = deploy_tree / "kustomize" / "overlays" / f"{base}-storage-class"
        folder.mkdir(exist_ok=True)
        (folder / "kustomization.yaml").write_text(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
            f"resources:\n  - ../{base}\n{documented_patch()}"
        )
        (nats,) = render(folder, kubectl).of_kind("StatefulSet")
        (claim,) = nats["spec"]["volumeClaimTemplates"]
        assert claim["metadata"]["name"] == "data"
        assert claim["spec"]["storageClassName"] == "fast-ssd"
