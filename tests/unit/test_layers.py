"""The house rule of src/bulkfetch (docs/architecture.md): packages by feature, stacked in
layers. A module imports only from its own layer or the layers below; nothing imports in a
circle; the reference server and the benchmarks stand beside the product and take only its
leaf helpers. Every import counts: at the top of a module, inside a function, or under
TYPE_CHECKING."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import bulkfetch

PACKAGE = Path(bulkfetch.__file__).parent
MAP = PACKAGE.parents[1] / "docs" / "architecture.md"

# From the top down; a module may import from its own layer and the ones below.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("cli", "__main__"),
    ("", "api", "streaming", "client", "dataset", "hashing", "oci", "testing"),
    ("runners",),
    ("engine", "listing"),
    ("sources", "sinks", "dest"),
    ("net", "s3", "util", "config", "models", "errors", "_version"),
)
# Beside the product: they import only these, and only these import them.
BESIDE = ("server", "bench")
BESIDE_TAKES = ("util", "errors", *BESIDE)
BESIDE_TAKEN_BY = ("cli", "testing", *BESIDE)
# The rule as docs/architecture.md states it, word for word.
RULE = ("cli → (api, streaming, client, dataset, hashing, oci, testing) → runners → "
        "(engine, listing) → (sources, sinks, dest) → (net, s3, util, config, models, "
        "errors); server and bench beside, importing only util and errors")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported(name: str, path: Path) -> Iterator[str]:
    """The bulkfetch modules `name` imports: a `from X import Y` names X, and X.Y too when
    Y is a module of its own."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names
                        if alias.name.split(".")[0] == "bulkfetch")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target.split(".")[0] != "bulkfetch":
                continue
            yield target
            for alias in node.names:
                if f"{target}.{alias.name}" in modules():
                    yield f"{target}.{alias.name}"


@cache
def graph() -> dict[str, frozenset[str]]:
    known = modules()
    return {name: frozenset(target for target in imported(name, path)
                            if target in known and target != name)
            for name, path in known.items()}


def unit_of(module: str) -> str:
    """The package (or top-level module) `module` belongs to, "" for bulkfetch itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_of(unit: str) -> int | None:
    return next((at for at, layer in enumerate(LAYERS) if unit in layer), None)


def test_every_package_and_top_level_module_has_a_place_in_the_rule() -> None:
    placed = {unit for layer in LAYERS for unit in layer} | set(BESIDE)
    missing = sorted({unit_of(module) for module in modules()} - placed)
    assert not missing, f"not in LAYERS or BESIDE (give each a layer): {missing}"


Graph = dict[str, frozenset[str]]


def upward_imports(edges: Graph) -> list[str]:
    found = []
    for module, targets in edges.items():
        here = layer_of(unit_of(module))
        for target in targets:
            there = layer_of(unit_of(target))
            if here is not None and there is not None and there < here:
                found.append(f"{module} -> {target}")
    return sorted(found)


def crossings(edges: Graph) -> list[str]:
    """Imports out of the server and the benchmarks into the product (but its leaf helpers),
    and into them from anywhere but the CLI and the testing helpers."""
    found = []
    for module, targets in edges.items():
        for target in targets:
            source, taken = unit_of(module), unit_of(target)
            if (source in BESIDE and taken not in BESIDE_TAKES) or (
                    taken in BESIDE and source not in BESIDE_TAKEN_BY):
                found.append(f"{module} -> {target}")
    return sorted(found)


def circles(edges: Graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    found = upward_imports(graph())
    assert not found, "imports that run up the layers:\n" + "\n".join(found)


def test_the_server_and_the_benchmarks_take_only_leaf_helpers_and_only_the_cli_takes_them(
        ) -> None:
    found = crossings(graph())
    assert not found, "beside the product, crossed:\n" + "\n".join(found)


def test_no_modules_import_each_other_in_a_circle() -> None:
    found = circles(graph())
    assert not found, "import circles:\n" + "\n".join(map(" <-> ".join, found))


def test_the_map_states_the_rule_this_test_keeps() -> None:
    text = " ".join(MAP.read_text(encoding="utf-8").split())
    assert RULE in text, f"docs/architecture.md should state the layer rule: {RULE}"


def test_the_checks_find_an_import_planted_against_each_rule() -> None:
    def planted(module: str, target: str) -> Graph:
        edges = dict(graph())
        edges[module] = edges[module] | {target}
        return edges

    assert "bulkfetch.errors -> bulkfetch.cli.main" in upward_imports(
        planted("bulkfetch.errors", "bulkfetch.cli.main"))
    assert "bulkfetch.server.app -> bulkfetch.dest.journal" in crossings(
        planted("bulkfetch.server.app", "bulkfetch.dest.journal"))
    assert ["bulkfetch.config", "bulkfetch.models"] in circles(
        planted("bulkfetch.models", "bulkfetch.config"))
