"""The Dockerfile builds from what the build context holds, runs as non-root, and provides every
command the manifests and docker-compose.yml run. (No container runtime here: the build itself is
checked where Docker is available; these are the parts that can be checked without one.)"""

from __future__ import annotations

import fnmatch
import re
import subprocess
import tomllib
from typing import Final

import pytest
import yaml

from tests.deploy.manifests import REPO_ROOT, Rendering

DOCKERFILE: Final = REPO_ROOT / "Dockerfile"
DOCKERIGNORE: Final = REPO_ROOT / ".dockerignore"
IMAGE_EXTRAS: Final = {"hami-generate-secrets", "sh"}  # installed by the Dockerfile itself / the base image


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def included_by_dockerignore() -> list[str]:
    """The paths .dockerignore lets in: it excludes everything (**) and re-includes with '!'."""
    lines = [ln.strip() for ln in DOCKERIGNORE.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert lines[0] == "**"
    return [ln[1:].rstrip("/") for ln in lines if ln.startswith("!")]


def image_commands() -> set[str]:
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    return set(scripts) | IMAGE_EXTRAS


def test_every_copied_source_is_in_the_build_context() -> None:
    allowed = included_by_dockerignore()
    for word, args in instructions():
        if word != "COPY" or "--from=" in args:
            continue
        *sources, _ = [a for a in args.split() if not a.startswith("--")]
        for source in sources:
            path = source.rstrip("/")
            assert (REPO_ROOT / path).exists(), source
            assert any(path == a or path.startswith(a + "/") for a in allowed), f"{source} is excluded"


def test_the_image_runs_as_a_non_root_user() -> None:
    stages = [i for i, (word, _) in enumerate(instructions()) if word == "FROM"]
    final = instructions()[stages[-1] :]
    users = [args for word, args in final if word == "USER"]
    assert users, "the final stage sets no USER"
    assert users[-1].split(":")[0] not in ("0", "root")


def test_native_library_target_exists() -> None:
    targets = [args for word, args in instructions() if word == "RUN" and "make -C native/vgpu" in args]
    (run,) = targets
    target = re.search(r"make -C native/vgpu (\S+)", run)
    assert target is not None
    dry = subprocess.run(
        ["make", "-n", "-C", "native/vgpu", target.group(1)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert dry.returncode == 0, dry.stderr


def test_every_command_the_manifests_run_is_in_the_image(overlay: Rendering) -> None:
    commands = image_commands()
    hami_image = [ref for ref in overlay.containers() if ref.container["image"].startswith("hami-py")]
    assert hami_image
    for ref in hami_image:
        assert ref.container["command"][0] in commands, ref.where


def test_every_command_compose_runs_from_the_image_exists() -> None:
    compose = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
    commands = image_commands()
    for name, svc in compose["services"].items():
        if svc.get("image", "").startswith("hami-py") and svc.get("command"):
            assert svc["command"][0] in commands, name


def test_node_init_container_installs_what_the_image_ships(overlay: Rendering) -> None:
    shipped = "/opt/hami/vgpu/"
    assert any(word == "COPY" and args.endswith(shipped) for word, args in instructions())
    init = overlay.container("hami-node", "install-vgpu").container
    script = " ".join(init["args"])
    for name in ("libvgpu.so", "ld.so.preload"):
        assert shipped + name in script


@pytest.mark.parametrize("generated", ["api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py"])
def test_generated_stubs_are_rebuilt_not_copied(generated: str) -> None:
    path = f"libs/hami_common/deviceplugin/{generated}"
    patterns = [ln.strip() for ln in DOCKERIGNORE.read_text().splitlines() if ln.strip() and ln[0] not in "#!"]
    assert any(fnmatch.fnmatch(path, pattern) for pattern in patterns if pattern != "**")
    assert any("hami_common.deviceplugin.generate" in args for word, args in instructions() if word == "RUN")
