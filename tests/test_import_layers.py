"""The layers of the Python code, as pyproject.toml's import-linter contracts state them (docs/architecture.md):
the harness (``hami_cli``, ``hami_sim``) above the services above the core, no service importing another, the
placement engine, codecs and device families free of I/O, no import circle in any package.

``make lint`` runs ``lint-imports`` too; here it runs in ``make test`` so CI holds the layers, and the same
contracts are shown to catch each kind of break on a small tree of stand-in packages.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
CONTRACTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


def _lint(cwd: Path, config: Path | None = None, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    argv = [str(LINT_IMPORTS), "--no-cache"]
    if config is not None:
        argv += ["--config", str(config)]
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120, check=False, env=env)


def test_the_repository_keeps_every_contract() -> None:
    done = _lint(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"Contracts: {len(CONTRACTS['contracts'])} kept, 0 broken." in done.stdout


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return '"' + str(value).replace('"', '\\"') + '"'


def _config(path: Path) -> Path:
    """The repository's contracts, written out for a tree of stand-in packages."""
    lines = ["[tool.importlinter]"]
    lines += [f"{k} = {_toml_value(v)}" for k, v in CONTRACTS.items() if k != "contracts"]
    for contract in CONTRACTS["contracts"]:
        lines += ["", "[[tool.importlinter.contracts]]"]
        lines += [f"{k} = {_toml_value(v)}" for k, v in contract.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def _tree(root: Path, extra: dict[str, str]) -> None:
    """Every root package as an empty stand-in, the modules the contracts name, then ``extra`` (module: source)."""
    modules = dict.fromkeys(CONTRACTS["root_packages"], "")
    roots = tuple(CONTRACTS["root_packages"])
    for contract in CONTRACTS["contracts"]:
        named = [*contract.get("source_modules", ()), *contract.get("forbidden_modules", ())]
        modules.update({name: "" for name in named if name.split(".")[0] in roots})
    modules.update(
        {
            "hami_common.scheduling.score": "",
            "hami_common.vendors.registry": "",
            "hami_common.vendors.ascend": "from hami_common.vendors import registry\n",
        }
    )
    modules.update(extra)
    for module, source in modules.items():
        package = root.joinpath(*module.split("."))
        package.mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").write_text(source)


@pytest.mark.parametrize(
    ("extra", "broken"),
    [
        ({}, None),
        ({"hami_webhook": "import hami_extender\n"}, "no service imports another"),
        ({"hami_common.scheduling.score": "import hami_allocator\n"}, "no service imports another"),
        ({"hami_extender": "import hami_sim\n"}, "no service imports another"),
        ({"hami_common.scheduling.score": "import asyncio\n"}, "do no I/O"),
        ({"hami_common.vendors.ascend": "import nats\n"}, "do no I/O"),
        ({"hami_common.vendors.registry": "from hami_common.vendors import ascend\n"}, "no import circles"),
    ],
    ids=[
        "clean",
        "service-to-service",
        "core-to-service",
        "service-to-harness",
        "io-in-engine",
        "io-in-family",
        "cycle",
    ],
)
def test_the_contracts_catch_each_kind_of_break(tmp_path: Path, extra: dict[str, str], broken: str | None) -> None:
    src = tmp_path / "src"
    _tree(src, extra)
    done = _lint(tmp_path, _config(tmp_path / "contracts.toml"), pythonpath=src)
    if broken is None:
        assert done.returncode == 0, done.stdout + done.stderr
    else:
        assert done.returncode == 1, done.stdout + done.stderr
        report = done.stdout.split("Broken contracts", 1)[-1]
        assert broken in report, done.stdout
