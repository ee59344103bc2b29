"""One name per concept: HAMi's annotation keys and our subjects are spelt in exactly one module each."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO_ROOT

# The only homes of the "hami.io/..." annotation keys and the "hami." subject names.
HOMES = (
    REPO_ROOT / "libs" / "hami_common" / "annotations",
    REPO_ROOT / "libs" / "hami_common" / "subjects.py",
    # A device family's own keys live once in its package (libs/hami_common/vendors/<family>/keys.py).
    *sorted((REPO_ROOT / "libs" / "hami_common" / "vendors").glob("*/keys.py")),
    # the entry-point group the device families are found in ("hami.vendors"), named in pyproject.toml
    REPO_ROOT / "libs" / "hami_common" / "vendors" / "registry.py",
)
FORBIDDEN_PREFIXES = ("hami.io/", "hami.")


def _python_files() -> list[Path]:
    roots = [REPO_ROOT / "libs", REPO_ROOT / "services", REPO_ROOT / "harness", REPO_ROOT / "benchmarks"]
    return sorted(p for root in roots if root.is_dir() for p in root.rglob("*.py") if "_pb2" not in p.name)


def _is_home(path: Path) -> bool:
    return any(path == home or home in path.parents for home in HOMES)


def test_wire_name_literals_live_only_in_their_modules() -> None:
    offenders: list[str] = []
    for path in _python_files():
        if _is_home(path):
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstrings
                and node.value.startswith(FORBIDDEN_PREFIXES)
            ):
                offenders.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}: {node.value!r}")
    assert offenders == [], "import the constant instead:\n" + "\n".join(offenders)


def test_the_checker_sees_the_homes() -> None:
    homes = [p for p in _python_files() if _is_home(p)]
    assert any(p.name == "keys.py" for p in homes)
    assert any(p.name == "subjects.py" for p in homes)
