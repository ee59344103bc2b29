"""Pod manifests from YAML files (several documents per file allowed), as ``kubectl apply -f`` reads them."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from hami_common.errors import InvalidInput

__all__ = ["read_pods"]


def read_pods(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every ``kind: Pod`` document of the files (a directory stands for its ``*.yaml`` files, sorted)."""
    files: list[Path] = []
    for path in paths:
        files += sorted(path.glob("*.yaml")) if path.is_dir() else [path]
    pods = []
    for file in files:
        try:
            docs = list(yaml.safe_load_all(file.read_text()))
        except (OSError, yaml.YAMLError) as err:
            raise InvalidInput(f"{file}: {err}") from err
        for doc in docs:
            if isinstance(doc, dict) and doc.get("kind") == "Pod":
                pods.append(doc)
    return pods
