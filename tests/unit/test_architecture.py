"""The package's layering holds: which file may import which (docs/architecture.md).

The import graph is built from the source with ``ast``, file by file, with the folders laid
out by import name (``scheduler/`` is ``apportion.scheduler``, ``worker/`` is
``apportion.worker``, ``k8s_operator/`` is ``apportion.operator``). Every import counts:
at module level, inside a function, under ``if TYPE_CHECKING``. An import names one file:
``from apportion import config`` names ``apportion/config.py`` (not ``__init__.py``, which
Python runs first anyway); ``from apportion import Client`` names ``apportion/__init__.py``.

Rooms, bottom to top; a file may import files of its own room and of the rooms its room
lists (and no circle of files anywhere):

- core: what both sides need;
- server: the scheduler and the worker, each importing core and itself only;
- operator: core and itself only;
- client: core and the client;
- entry points: anything (``apportion/__init__.py``: core and client only).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import sysconfig
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]

# Import name -> folder, relative to the repository root (pyproject's package-dir).
LAYOUT = {
    "apportion": "apportion",
    "apportion.scheduler": "scheduler",
    "apportion.worker": "worker",
    "apportion.operator": "k8s_operator",
}

# ----------------------------------------------------------------------------- the graph


@dataclass(frozen=True)
class Import:
    """One import statement of one file, resolved to the file it names."""

    importer: str  # module name of the file that imports
    imported: str  # module name of the file named
    line: int
    statement: str  # as written, for messages

    def __str__(self) -> str:
        return f"{self.importer} (line {self.line}: {self.statement}) -> {self.imported}"


def module_files(root: Path, layout: Mapping[str, str] = LAYOUT) -> dict[str, Path]:
    """Every module of the package, by import name, and its file."""
    modules: dict[str, Path] = {}
    for package, folder in layout.items():
        base = root / folder
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            if "__pycache__" in parts or not all(p.isidentifier() for p in parts):
                continue
            # A folder mapped to a package of its own (none today inside another's) or
            # a sub-folder that is not a package is not part of this package.
            if not all(
                (base.joinpath(*parts[:i]) / "__init__.py").is_file() for i in range(1, len(parts))
            ):
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((package, *parts))] = path
    return modules


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _imports_of(
    module: str, path: Path, modules: Mapping[str, Path]
) -> Iterator[tuple[ast.stmt, str]]:
    """(statement, module named) for each import of ours in the file; every statement in
    the file, at whatever depth, is looked at."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                # `import a.b.c` names a.b.c (Python runs a and a.b first, as for any file).
                named = _innermost(alias.name, modules)
                if named is not None:
                    yield node, named
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = _package_of(module, path).split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                source = ".".join(anchor + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in modules:  # `from apportion import config`: config.py
                    yield node, submodule
                else:
                    named = _innermost(source, modules)
                    if named is not None:
                        yield node, named


def _innermost(name: str, modules: Mapping[str, Path]) -> str | None:
    """The module a dotted name refers to, as far as it is one of ours."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def import_graph(root: Path, layout: Mapping[str, str] = LAYOUT) -> list[Import]:
    """Every import between the package's files: one entry per statement and file named,
    in file and line order."""
    modules = module_files(root, layout)
    found: dict[tuple[str, str, int], Import] = {}
    for module, path in modules.items():
        source = path.read_text()
        for statement, named in _imports_of(module, path, modules):
            if named == module or (module, named, statement.lineno) in found:
                continue
            text = " ".join((ast.get_source_segment(source, statement) or "").split())
            found[module, named, statement.lineno] = Import(module, named, statement.lineno, text)
    return sorted(found.values(), key=lambda i: (i.importer, i.line, i.imported))


def circles(imports: list[Import]) -> list[list[str]]:
    """The groups of files that import each other round a circle (strongly connected
    components of more than one file), each sorted, largest first."""
    edges: dict[str, set[str]] = {}
    for edge in imports:
        edges.setdefault(edge.importer, set()).add(edge.imported)
        edges.setdefault(edge.imported, set())
    # Tarjan's algorithm, iterative (recursion would go as deep as the longest chain).
    index: dict[str, int] = {}
    lowlink: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(edges[start])))]
        index[start] = lowlink[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for successor in successors:
                if successor not in index:
                    index[successor] = lowlink[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(edges[successor]))))
                    advanced = True
                    break
                if successor in on_stack:
                    lowlink[node] = min(lowlink[node], index[successor])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                lowlink[parent] = min(lowlink[parent], lowlink[node])
            if lowlink[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return sorted(components, key=lambda c: (-len(c), c))


# ----------------------------------------------------------------------------- the rooms

CORE = "core"
SCHEDULER = "server (scheduler)"
WORKER = "server (worker)"
OPERATOR = "operator"
CLIENT = "client"
ENTRY = "entry point"
FACADE = "entry point (apportion/__init__.py)"

_CORE_FILES = {
    "errors", "resources", "restrictions", "auth", "backoff", "serialize", "config_schema",
    "config", "aio", "logs", "annotations", "shared_memory", "memory_limit",
}  # fmt: skip
_CLIENT_FILES = {
    "session", "future_table", "client", "async_client", "futures", "cluster_ops",
    "coordination", "data", "datasets", "default_client", "lineage", "worker_client", "progress",
    "reprs", "import_hooks", "joblib_backend", "actors", "actor_host",
    "performance_report", "stored_args", "local", "cluster_base", "kubernetes", "port_forward",
    "process", "ssh",
    # the client's reconnection to a restarted scheduler
    "reconnect",
    "placement_group",
}  # fmt: skip
_ENTRY_FILES = {
    "cli",
    "__main__",
    "demo",
    "build_info",
    "ssh_remote",
    "kubectl_plugin",
    "kubectl_objects",
}

# What each room may import besides itself.
ALLOWED = {
    CORE: {CORE},
    SCHEDULER: {CORE, SCHEDULER},
    WORKER: {CORE, WORKER},
    OPERATOR: {CORE, OPERATOR},
    CLIENT: {CORE, CLIENT},
    FACADE: {CORE, CLIENT},
    ENTRY: {CORE, SCHEDULER, WORKER, OPERATOR, CLIENT, FACADE, ENTRY},
}


def room_of(module: str) -> str | None:
    """The room of a module of the package; None for one no rule names yet."""
    if module == "apportion":
        return FACADE
    for package, room in (
        ("apportion.scheduler", SCHEDULER),
        ("apportion.worker", WORKER),
        ("apportion.operator", OPERATOR),
        ("apportion.protocol", CORE),
        ("apportion.core", CORE),
    ):
        if module == package or module.startswith(package + "."):
            return room
    name = module.removeprefix("apportion.")
    if name in _CORE_FILES:
        return CORE
    if name in _CLIENT_FILES or name.startswith("dask_"):
        return CLIENT
    if name in _ENTRY_FILES:
        return ENTRY
    return None


def breaches(imports: list[Import], rooms: list[str]) -> list[str]:
    """The imports made by files of these rooms that their rooms do not allow."""
    found = []
    for edge in imports:
        importer_room, imported_room = room_of(edge.importer), room_of(edge.imported)
        if importer_room in rooms and imported_room not in ALLOWED[importer_room]:
            found.append(f"{edge}  [{importer_room} may not import {imported_room}]")
    return found


def _report(title: str, lines: list[str]) -> str:
    text = f"{title} ({len(lines)}):\n" + "\n".join(f"  {line}" for line in lines)
    print(text)
    return text


class Graph(list[Import]):
    """The package's imports, shown by their count in a failure's report (the report
    itself lists the ones that matter)."""

    def __repr__(self) -> str:
        return f"<{len(self)} imports between the package's files>"


@pytest.fixture(scope="module")
def graph() -> list[Import]:
    return Graph(import_graph(ROOT))


# ----------------------------------------------------------------------------- the rules


def test_no_circle_of_files(graph: list[Import]) -> None:
    found = circles(graph)
    lines = []
    for component in found:
        members = set(component)
        inside = [str(e) for e in graph if e.importer in members and e.imported in members]
        lines.append(f"circle of {len(component)} files: {', '.join(component)}")
        lines.extend(f"    {edge}" for edge in inside)
    assert not found, _report("files that import each other round a circle", lines)


def test_every_file_of_the_package_is_in_a_room() -> None:
    unplaced = sorted(m for m in module_files(ROOT) if room_of(m) is None)
    assert not unplaced, _report(
        "files in no room: name each in tests/unit/test_architecture.py and docs/architecture.md",
        unplaced,
    )


@pytest.mark.parametrize(
    "room",
    [CORE, SCHEDULER, WORKER, OPERATOR, CLIENT, FACADE],
    ids=["core", "scheduler", "worker", "operator", "client", "init"],
)
def test_each_room_imports_only_the_rooms_below_it(graph: list[Import], room: str) -> None:
    found = breaches(graph, [room])
    assert not found, _report(
        f"{room} files import what they may not (allowed: {sorted(ALLOWED[room])})", found
    )


def test_the_scheduler_and_the_worker_never_import_each_other(graph: list[Import]) -> None:
    found = [
        str(e) for e in graph if {room_of(e.importer), room_of(e.imported)} == {SCHEDULER, WORKER}
    ]
    assert not found, _report("imports between the scheduler and the worker", found)


def _raises_not_implemented(node: ast.AST) -> bool:
    if not isinstance(node, ast.Raise) or node.exc is None:
        return False
    exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
    return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"


def test_no_stub_stands_in_for_another_class_s_method() -> None:
    """What a module needs of a class it does not define is a Protocol that mypy checks the
    class against (``RetirementHost``, ``AdoptionHost``, ``StateView``, ``SchedulerShell``),
    never a method that raises NotImplementedError until a subclass fills it in."""
    found = [
        f"{module} (line {node.lineno})"
        for module, path in sorted(module_files(ROOT).items())
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if _raises_not_implemented(node)
    ]
    assert not found, _report("stubs raising NotImplementedError", found)


def test_the_scheduler_state_is_one_class() -> None:
    """Its components (retirement.py, adoption.py, secession.py, ...) are functions and
    classes over it, not bases of it: every change of a task's state is in state.py or
    reached through a protocol that names what it uses."""
    tree = ast.parse((ROOT / "scheduler" / "state.py").read_text())
    (state,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SchedulerState"]
    assert not state.bases, f"SchedulerState derives from {[ast.unparse(b) for b in state.bases]}"


def test_nothing_is_importable_as_a_top_level_operator() -> None:
    """Python's standard library has an ``operator``: a folder or file of that name where
    the repository is on sys.path (a checkout, pytest's rootdir) would shadow it."""
    shadows = [p.name for p in ROOT.iterdir() if p.name in ("operator", "operator.py")]
    shadows += [p.name for p in (ROOT / "tests").iterdir() if p.name in ("operator", "operator.py")]
    assert not shadows, f"these shadow the standard library's operator: {shadows}"
    found = subprocess.run(
        [sys.executable, "-c", "import operator; print(operator.__file__)"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    assert Path(found).resolve().parent == stdlib, (
        f"`import operator` from the repository gives {found}, not the standard library's"
    )


# ----------------------------------------------------------------------------- the builder


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_graph_counts_every_kind_of_import_and_names_files(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "apportion/__init__.py": "from apportion.client import Client\n",
            "apportion/client.py": (
                "from typing import TYPE_CHECKING\n"
                "from apportion import config\n"  # the file, not __init__.py
                "if TYPE_CHECKING:\n"
                "    from apportion.scheduler.state import State\n"
                "def f():\n"
                "    import apportion.worker.server\n"
                "    from . import errors\n"
                "    from .protocol import frames, NOT_A_MODULE\n"
            ),
            "apportion/config.py": "from apportion import Client\nimport os\n",
            "apportion/errors.py": "",
            "apportion/protocol/__init__.py": "NOT_A_MODULE = 1\n",
            "apportion/protocol/frames.py": "from ..errors import x\n",
            "scheduler/__init__.py": "",
            "scheduler/state.py": "from apportion.scheduler import model\n",
            "scheduler/model.py": "",
            "worker/__init__.py": "",
            "worker/server.py": "",
            "not_mapped/thing.py": "import apportion.client\n",
        },
    )
    layout = {
        "apportion": "apportion",
        "apportion.scheduler": "scheduler",
        "apportion.worker": "worker",
    }
    found = {(e.importer, e.imported) for e in import_graph(root, layout)}
    assert found == {
        ("apportion", "apportion.client"),
        ("apportion.client", "apportion.config"),
        ("apportion.client", "apportion.scheduler.state"),
        ("apportion.client", "apportion.worker.server"),
        ("apportion.client", "apportion.errors"),
        ("apportion.client", "apportion.protocol.frames"),
        ("apportion.client", "apportion.protocol"),
        ("apportion.config", "apportion"),
        ("apportion.protocol.frames", "apportion.errors"),
        ("apportion.scheduler.state", "apportion.scheduler.model"),
    }


def test_circles_are_found_with_all_their_files(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "apportion/__init__.py": "",
            "apportion/a.py": "from apportion import b\n",
            "apportion/b.py": "def f():\n    from apportion.c import x\n",
            "apportion/c.py": "import apportion.a\n",
            "apportion/d.py": "import apportion.a\nfrom apportion import e\n",
            "apportion/e.py": "from apportion import d\n",
            "apportion/f.py": "import apportion.a\n",
        },
    )
    assert circles(import_graph(root, {"apportion": "apportion"})) == [
        ["apportion.a", "apportion.b", "apportion.c"],
        ["apportion.d", "apportion.e"],
    ]


def test_breaches_name_the_file_and_the_import(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "apportion/__init__.py": "",
            "apportion/errors.py": "",
            "apportion/client.py": "from apportion.errors import E\n",
            "scheduler/__init__.py": "",
            "scheduler/state.py": "from apportion.client import Client\n",
        },
    )
    graph = import_graph(root, {"apportion": "apportion", "apportion.scheduler": "scheduler"})
    assert breaches(graph, [CLIENT]) == []
    assert breaches(graph, [SCHEDULER]) == [
        "apportion.scheduler.state (line 1: from apportion.client import Client) -> "
        "apportion.client  [server (scheduler) may not import client]"
    ]
