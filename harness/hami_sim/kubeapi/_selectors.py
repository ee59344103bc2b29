"""Label and field selectors, parsed from their query-string form and matched against JSON objects."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "FieldSelector",
    "LabelSelector",
    "Resolver",
    "SelectorError",
    "label_selector_of",
    "lookup",
    "parse_field_selector",
    "parse_label_selector",
]

_SET_RE: Final = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*(?:(in|notin)\s*\(([^)]*)\))?\s*$")
_CMP_RE: Final = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|!=|=)\s*([A-Za-z0-9_.-]*)\s*$")


class SelectorError(ValueError):
    """A selector that does not parse; the API answers 400 BadRequest."""


@dataclass(frozen=True, slots=True)
class _Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: frozenset[str]

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "=":
            return present and value in self.values
        if self.op == "!=":
            return not present or value not in self.values
        if self.op == "in":
            return present and value in self.values
        if self.op == "notin":
            return not present or value not in self.values
        if self.op == "exists":
            return present
        return not present


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside ``in (...)`` parentheses."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth != 0:
        raise SelectorError(f"unbalanced parentheses in selector {text!r}")
    parts.append("".join(current))
    return [p for p in parts if p.strip()]


@dataclass(frozen=True, slots=True)
class LabelSelector:
    requirements: tuple[_Requirement, ...] = ()

    def matches(self, obj: Mapping[str, Any]) -> bool:
        metadata = obj.get("metadata") or {}
        labels = metadata.get("labels") or {}
        return all(req.matches(labels) for req in self.requirements)


def parse_label_selector(text: str | None) -> LabelSelector:
    if not text:
        return LabelSelector()
    requirements = []
    for part in _split_top_level(text):
        cmp = _CMP_RE.match(part)
        if cmp:
            key, op, value = cmp.groups()
            requirements.append(_Requirement(key, "!=" if op == "!=" else "=", frozenset({value})))
            continue
        sets = _SET_RE.match(part)
        if not sets:
            raise SelectorError(f"unable to parse requirement {part.strip()!r}")
        negated, key, op, values = sets.groups()
        if op:
            if negated:
                raise SelectorError(f"unable to parse requirement {part.strip()!r}")
            items = frozenset(v.strip() for v in values.split(",") if v.strip())
            requirements.append(_Requirement(key, op, items))
        else:
            requirements.append(_Requirement(key, "!exists" if negated else "exists", frozenset()))
    return LabelSelector(tuple(requirements))


_OPERATORS: Final = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!exists"}


def label_selector_of(selector: object) -> LabelSelector:
    """A ``metav1.LabelSelector`` object (``matchLabels``, ``matchExpressions``); absent or empty: everything."""
    if selector is None:
        return LabelSelector()
    if not isinstance(selector, Mapping):
        raise SelectorError("a label selector must be an object")
    labels = selector.get("matchLabels") or {}
    requirements = [_Requirement(str(k), "=", frozenset({str(v)})) for k, v in labels.items()]
    for expression in selector.get("matchExpressions") or []:
        if not isinstance(expression, Mapping) or expression.get("operator") not in _OPERATORS:
            raise SelectorError(f"unsupported label selector expression {expression!r}")
        values = frozenset(str(v) for v in expression.get("values") or [])
        requirements.append(_Requirement(str(expression.get("key", "")), _OPERATORS[expression["operator"]], values))
    return LabelSelector(tuple(requirements))


def _lookup(obj: Mapping[str, Any], path: str) -> str:
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, Mapping):
            return ""
        node = node.get(part)
    if node is None:
        return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


Resolver = Callable[[Mapping[str, Any], str], str]


def lookup(obj: Mapping[str, Any], path: str) -> str:
    """The value a field selector compares: the dotted JSON path, as a string ("" when absent)."""
    return _lookup(obj, path)


@dataclass(frozen=True, slots=True)
class FieldSelector:
    """``path=value`` / ``path!=value`` terms over dotted JSON paths (``spec.nodeName``); ``resolve`` gives a
    kind's computed fields (an event's ``source``)."""

    terms: tuple[tuple[str, bool, str], ...] = ()
    resolve: Resolver = lookup

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return all((self.resolve(obj, path) == value) == equal for path, equal, value in self.terms)

    def paths(self) -> frozenset[str]:
        return frozenset(path for path, _, _ in self.terms)


def parse_field_selector(text: str | None, allowed: Callable[[str], bool], resolve: Resolver = lookup) -> FieldSelector:
    if not text:
        return FieldSelector()
    terms = []
    for part in text.split(","):
        if not part.strip():
            continue
        if "!=" in part:
            path, value = part.split("!=", 1)
            equal = False
        elif "==" in part:
            path, value = part.split("==", 1)
            equal = True
        elif "=" in part:
            path, value = part.split("=", 1)
            equal = True
        else:
            raise SelectorError(f"invalid field selector term {part!r}")
        path = path.strip()
        if not allowed(path):
            raise SelectorError(f"field label not supported: {path}")
        terms.append((path, equal, value.strip()))
    return FieldSelector(tuple(terms), resolve)
