"""Device families are found through the ``hami.vendors`` entry points: the shipped three from pyproject.toml,
and a vendor shipped as a distribution of its own without a line of ours changed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from importlib.metadata import entry_points
from pathlib import Path

from hami_common.vendors.registry import ENTRY_POINT_GROUP, plugin_modules, registered_sections
from tests.conftest import REPO_ROOT


def test_the_shipped_families_are_the_entry_points_pyproject_names() -> None:
    declared = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["entry-points"][ENTRY_POINT_GROUP]
    installed = {point.name: point.value for point in entry_points(group=ENTRY_POINT_GROUP)}
    assert installed == declared
    assert registered_sections() == {"vnpus", "cambricon", "hygon"}
    # the shipped order (their devices after NVIDIA's), whichever family a caller imported first
    assert plugin_modules() == tuple(f"hami_common.vendors.{f}.plugin" for f in ("ascend", "cambricon", "hygon"))


def _with_distribution(tmp_path: Path, module_source: str, script: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a fresh interpreter that also sees an installed distribution ``hami-metax`` whose
    ``hami.vendors`` entry point names ``hami_metax:SOURCE``."""
    (tmp_path / "hami_metax.py").write_text(textwrap.dedent(module_source))
    info = tmp_path / "hami_metax-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hami-metax\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nmetax = hami_metax:SOURCE\n")
    return subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n" + textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_vendor_of_its_own_distribution_is_found_and_enabled_by_its_section(tmp_path: Path) -> None:
    done = _with_distribution(
        tmp_path,
        """
        from hami_common.vendors import ascend
        from hami_common.vendors.registry import FamilySource

        # a stand-in family: Ascend's 910B3 under another section, placed between Ascend and Cambricon
        def build(raw):
            chips = tuple(c for c in ascend.CHART_CHIPS if c.common_word == "Ascend910B3")
            return ascend.families(ascend.AscendConfig(enabled=True, configs=chips))

        SOURCE = FamilySource("metax", build, rank=15)
        """,
        """
        from hami_common.vendors.registry import configured, plugin_modules, registered_sections
        print(sorted(registered_sections()))
        print([f.word for f in configured({"hygon": None, "cambricon": None, "metax": None})])
        print(plugin_modules())
        """,
    )
    assert done.returncode == 0, done.stderr
    sections, words, plugins = done.stdout.splitlines()
    assert sections == "['cambricon', 'hygon', 'metax', 'vnpus']"
    assert words == "['Ascend910B3', 'MLU', 'DCU']"  # by rank: 15 goes before Cambricon's 20
    assert "metax" not in plugins  # it names no fake device plugin


def test_an_entry_point_that_is_not_a_family_source_is_refused_by_name(tmp_path: Path) -> None:
    done = _with_distribution(
        tmp_path,
        "SOURCE = object()\n",
        "from hami_common.vendors.registry import registered_sections; registered_sections()\n",
    )
    assert done.returncode != 0
    assert "entry point metax = hami_metax:SOURCE (hami.vendors) is not a FamilySource" in done.stderr
