"""The interposer's layers (native/vgpu/README.md): every file of native/vgpu/src sits in one layer, and a
file includes only headers of its own layer and the layers below it, with no cycle among the includes.

C needs a declaration before a call (the library is built with -Werror), so the include graph bounds the
call graph: a layer that includes nothing above it calls nothing above it except through the start-up
table that init.c provides (init.c says why that one cannot be a callback registered at run time)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Final

import pytest

from tests.native._probe import VGPU_DIR

SRC: Final = VGPU_DIR / "src"
API: Final = VGPU_DIR / "include"

# Bottom to top. A new file of src/ must be placed here.
LAYERS: Final[tuple[tuple[str, frozenset[str]], ...]] = (
    ("config", frozenset({"config.h", "log.c", "limits.c"})),
    ("driver", frozenset({"driver.h", "hook_list.h", "driver.c", "devices.c", "dlsym.c"})),
    ("shared cache", frozenset({"shared_cache.h", "shared_cache.c", "hostpid.c"})),
    ("memory", frozenset({"memory.h", "memory.c", "alloc_table.c"})),
    ("throttle", frozenset({"throttle.h", "throttle.c"})),
    ("hooks", frozenset({"hooks.h", "hooks_cuda.c", "hooks_launch.c", "hooks_nvml.c", "context.c"})),
    ("init", frozenset({"init.c"})),
)

_INCLUDE: Final = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)

Graph = Mapping[str, Sequence[str]]


def include_graph(src: Path) -> dict[str, list[str]]:
    """Each .c and .h of src and the quoted includes it names, in order."""
    return {
        path.name: _INCLUDE.findall(path.read_text()) for path in sorted(src.iterdir()) if path.suffix in {".c", ".h"}
    }


def rank_of(layers: Sequence[tuple[str, Iterable[str]]]) -> dict[str, int]:
    return {name: rank for rank, (_, files) in enumerate(layers) for name in files}


def unplaced(graph: Graph, layers: Sequence[tuple[str, Iterable[str]]]) -> list[str]:
    """Problems with the table itself: a file of src/ in no layer (or in two), a placed file that is gone."""
    problems = []
    seen: dict[str, str] = {}
    for layer, files in layers:
        for name in files:
            if name in seen:
                problems.append(f"{name} is in two layers: {seen[name]} and {layer}")
            seen[name] = layer
    problems += [f"{name} is in no layer: place it in LAYERS" for name in graph if name not in seen]
    problems += [f"{name} is in LAYERS but not in src/" for name in seen if name not in graph]
    return problems


def upward_includes(graph: Graph, layers: Sequence[tuple[str, Iterable[str]]], api: Iterable[str]) -> list[str]:
    """Includes of a header of a higher layer, or of a header that is neither in src/ nor an API header."""
    rank = rank_of(layers)
    names = [layer for layer, _ in layers]
    api = set(api)
    problems = []
    for name, includes in graph.items():
        if name not in rank:
            continue  # reported by unplaced()
        for header in includes:
            if header in api:
                continue  # the driver API (include/): below every layer
            if header not in rank:
                if header not in graph:  # a file of src/ in no layer is reported by unplaced()
                    problems.append(f'{name} includes "{header}", which is neither in src/ nor in include/')
            elif rank[header] > rank[name]:
                problems.append(
                    f'{name} ({names[rank[name]]}) includes "{header}" of a higher layer ({names[rank[header]]})'
                )
    return problems


def include_cycle(graph: Graph) -> list[str] | None:
    """One cycle of the include graph (its files, the first repeated last), or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(name: str) -> list[str] | None:
        if name in path:
            return [*path[path.index(name) :], name]
        if name in done or name not in graph:
            return None
        path.append(name)
        for header in graph[name]:
            cycle = visit(header)
            if cycle:
                return cycle
        path.pop()
        done.add(name)
        return None

    for name in graph:
        cycle = visit(name)
        if cycle:
            return cycle
    return None


def _api_headers() -> list[str]:
    return [path.name for path in API.glob("*.h")]


def test_every_file_of_src_is_in_one_layer() -> None:
    problems = unplaced(include_graph(SRC), LAYERS)
    assert not problems, "\n".join(problems)


def test_no_file_includes_a_header_of_a_higher_layer() -> None:
    problems = upward_includes(include_graph(SRC), LAYERS, _api_headers())
    assert not problems, "\n".join(problems)


def test_the_include_graph_has_no_cycle() -> None:
    cycle = include_cycle(include_graph(SRC))
    assert cycle is None, "include cycle: " + " -> ".join(cycle or [])


# The checker itself, on small trees of its own.

_TOY_LAYERS: Final = (("low", {"low.h", "low.c"}), ("high", {"high.h", "high.c"}))


def _toy(tmp_path: Path, files: Mapping[str, str]) -> dict[str, list[str]]:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return include_graph(tmp_path)


def test_the_parser_reads_quoted_includes_only(tmp_path: Path) -> None:
    graph = _toy(
        tmp_path,
        {"low.c": '#include <stdio.h>\n  #  include "low.h"\n#include "vgpu_cuda.h"\n', "notes.txt": '#include "x.h"'},
    )
    assert graph == {"low.c": ["low.h", "vgpu_cuda.h"]}


def test_a_downward_include_passes(tmp_path: Path) -> None:
    graph = _toy(
        tmp_path,
        {"low.h": "", "low.c": '#include "low.h"\n', "high.h": '#include "low.h"\n', "high.c": '#include "high.h"\n'},
    )
    assert unplaced(graph, _TOY_LAYERS) == []
    assert upward_includes(graph, _TOY_LAYERS, []) == []
    assert include_cycle(graph) is None


def test_an_upward_include_is_named(tmp_path: Path) -> None:
    graph = _toy(tmp_path, {"low.h": "", "low.c": '#include "high.h"\n', "high.h": "", "high.c": ""})
    assert upward_includes(graph, _TOY_LAYERS, []) == ['low.c (low) includes "high.h" of a higher layer (high)']


def test_an_unknown_header_is_named(tmp_path: Path) -> None:
    graph = _toy(tmp_path, {"low.h": "", "low.c": '#include "gone.h"\n#include "api.h"\n', "high.h": "", "high.c": ""})
    assert upward_includes(graph, _TOY_LAYERS, ["api.h"]) == [
        'low.c includes "gone.h", which is neither in src/ nor in include/'
    ]


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (
            {"low.h": "", "low.c": "", "high.h": "", "high.c": "", "new.c": ""},
            ["new.c is in no layer: place it in LAYERS"],
        ),
        ({"low.h": "", "low.c": "", "high.h": ""}, ["high.c is in LAYERS but not in src/"]),
    ],
)
def test_the_table_must_match_src(tmp_path: Path, files: Mapping[str, str], expected: list[str]) -> None:
    assert unplaced(_toy(tmp_path, files), _TOY_LAYERS) == expected


def test_a_file_in_two_layers_is_named(tmp_path: Path) -> None:
    graph = _toy(tmp_path, {"low.h": "", "low.c": "", "high.h": "", "high.c": ""})
    layers = (*_TOY_LAYERS, ("top", {"low.c"}))
    assert unplaced(graph, layers) == ["low.c is in two layers: low and top"]


def test_a_cycle_is_named_even_within_one_layer(tmp_path: Path) -> None:
    graph = _toy(
        tmp_path,
        {"a.h": '#include "b.h"\n', "b.h": '#include "c.h"\n', "c.h": '#include "a.h"\n', "a.c": '#include "a.h"\n'},
    )
    cycle = include_cycle(graph)
    assert cycle is not None
    assert cycle[0] == cycle[-1]
    assert sorted(cycle[:-1]) == ["a.h", "b.h", "c.h"]
