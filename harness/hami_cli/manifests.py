"""Manifests from YAML files (several documents per file allowed), as ``kubectl apply -f`` reads them."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

import yaml

from hami_common.errors import InvalidInput

__all__ = ["YAML_SUFFIXES", "read_documents", "read_pods"]

YAML_SUFFIXES: Final = (".yaml", ".yml", ".json")  # what kubectl reads from a folder


def _files(paths: Iterable[Path]) -> list[Path]:
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files += sorted(p for p in path.iterdir() if p.suffix in YAML_SUFFIXES and p.is_file())
        elif path.exists():
            files.append(path)
        else:
            raise InvalidInput(f"{path}: no such file or folder")
    return files


def read_documents(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every document of the files (a folder stands for its ``*.yaml``/``*.yml``/``*.json`` files, sorted);
    a ``kind: List`` is unpacked as kubectl does; documents that are not mappings are skipped."""
    docs: list[dict[str, Any]] = []
    for file in _files(paths):
        try:
            loaded = list(yaml.safe_load_all(file.read_text()))
        except (OSError, yaml.YAMLError) as err:
            raise InvalidInput(f"{file}: {err}") from err
        for doc in loaded:
            if not isinstance(doc, dict):  # empty documents, stray scalars: nothing kubectl could apply
                continue
            if doc.get("kind") == "List" and isinstance(doc.get("items"), list):
                docs += [item for item in doc["items"] if isinstance(item, dict)]
            else:
                docs.append(doc)
    return docs


def read_pods(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every ``kind: Pod`` document of the files."""
    return [doc for doc in read_documents(paths) if doc.get("kind") == "Pod"]
