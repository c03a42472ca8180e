"""The client side's layering, read from the source: which file names which file in an
import (at module level, inside functions, or for type checking only).

The client library and the shared core never import the servers (``apportion.scheduler``,
``apportion.worker``) or the operator, and the files of ``apportion/`` import each other
without a circle. Only the entry points (the command line) may import anything.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "apportion"
# Import names of the folders mapped into the package (pyproject's package-dir).
SERVER_SIDE = ("apportion.scheduler", "apportion.worker", "apportion.operator")
# May import anything: they start processes of every kind.
ENTRY_POINTS = {"cli.py", "__main__.py", "demo.py", "build_info.py"}
# What both sides need (apportion/core/ and apportion/protocol/ besides): all the servers
# may import of apportion/.
CORE = {
    "errors",
    "resources",
    "restrictions",
    "auth",
    "backoff",
    "serialize",
    "config_schema",
    "config",
    "aio",
    "logs",
    "annotations",
    "shared_memory",
}


def _server_side(module: str) -> bool:
    return any(module == side or module.startswith(f"{side}.") for side in SERVER_SIDE)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _client_files() -> dict[str, Path]:
    """apportion/ and its sub-packages by module name (the servers live elsewhere)."""
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _library_files() -> dict[str, Path]:
    """The client library and the shared core: all of apportion/ but the entry points."""
    return {
        name: path
        for name, path in _client_files().items()
        if not (path.parent == PACKAGE and path.name in ENTRY_POINTS)
    }


def _imported_names(path: Path, modules: set[str]) -> set[str]:
    """Every module an import statement in ``path`` names, anywhere in the file:
    ``from a import b`` names ``a.b`` when that is one of ``modules``, else ``a``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = _module_name(path)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                module = ".".join([*parts, node.module] if node.module else parts)
            else:
                module = node.module or ""
            for alias in node.names:
                inner = f"{module}.{alias.name}"
                names.add(inner if inner in modules else module)
    return names


def import_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    """Which of ``files`` each of them names in an import (itself excluded)."""
    modules = set(files)
    return {
        name: {imported for imported in _imported_names(path, modules) if imported in modules}
        - {name}
        for name, path in files.items()
    }


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one file (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_client_and_the_core_never_import_the_servers_or_the_operator() -> None:
    files = _library_files()
    offenders = {
        name: sorted(n for n in _imported_names(path, set(files)) if _server_side(n))
        for name, path in files.items()
    }
    assert {name: found for name, found in offenders.items() if found} == {}


def test_the_files_of_the_client_import_each_other_without_a_circle() -> None:
    assert circles(import_graph(_library_files())) == []


def _is_core(module: str) -> bool:
    parts = module.split(".")
    return (
        parts[0] == "apportion"
        and len(parts) > 1
        and (parts[1] in CORE or parts[1] in ("core", "protocol"))
    )


def test_the_servers_import_no_client_module() -> None:
    library = set(_library_files())
    offenders = {}
    for folder in ("scheduler", "worker", "k8s_operator"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            found = sorted(
                name
                for name in _imported_names(path, library)
                if name in library and name != "apportion" and not _is_core(name)
            )
            if found:
                offenders[str(path.relative_to(ROOT))] = found
    assert offenders == {}


def test_the_package_facade_imports_only_the_core_and_the_client() -> None:
    facade = _imported_names(PACKAGE / "__init__.py", set(_client_files()))
    assert sorted(n for n in facade if _server_side(n)) == []


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
        ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ],
)
def test_circles_are_found_through_any_number_of_files(
    graph: dict[str, set[str]], expected: list[list[str]]
) -> None:
    assert circles(graph) == expected
