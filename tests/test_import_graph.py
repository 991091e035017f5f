"""No import cycles anywhere in the project, function-level imports included.

import-linter (``tests/test_layers.py``) checks the declared layers between packages; this test reads every
module's source with :mod:`ast` and collects *every* import at any depth (inside functions, methods and ``if
TYPE_CHECKING:`` blocks too), so a cycle closed by a function-level import — invisible until that function
runs — fails here. Runs in well under a second: nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pruning", "registry", "server", "loadtest", "depthprune", "ground")
LOWER_PACKAGES = ("pruning", "registry", "server", "loadtest")
TOP_DOWN = ("depthprune", ("pruning", "server", "loadtest"), "registry", "ground")
"""The top-level folders from the shell down to the ground: each may import only those after it."""


def module_names() -> dict[str, Path]:
    """Every module of our packages, by dotted name (a package by its own name, for its ``__init__``)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ours that ``name`` imports anywhere in its source.

    ``from package import name`` counts as importing the submodule ``package.name`` when there is one, else
    ``package`` itself; relative imports are resolved against the module's package.
    """
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names
            ]
        else:
            continue
        for target in targets:
            # ``import a.b.c`` of a module of ours: the longest known prefix is what it names.
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = module_names()
    known = set(modules)
    return {name: imported_modules(name, path, known) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, stack = set(), [start]
    while stack:
        for target in graph.get(stack.pop(), ()):
            if target not in seen:
                seen.add(target)
                stack.append(target)
    return seen


def test_the_graph_sees_function_level_imports():
    """The graph is built from the whole source: a function-level import is an edge."""
    graph = import_graph()
    assert "pruning.calibration.data.sampling" in graph["pruning.calibration.scoring.build"]
    assert "depthprune.cli.app" in graph["depthprune.testing.cli"]  # imported inside run_cli


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def top_level(name: str) -> str:
    return name.split(".")[0]


def test_nothing_below_the_shell_imports_it():
    """No module of pruning, registry, server, loadtest or the ground imports anything of ``depthprune``."""
    offenders = {
        name: sorted(target for target in targets if top_level(target) == "depthprune")
        for name, targets in import_graph().items()
        if top_level(name) != "depthprune"
    }
    assert {name: targets for name, targets in offenders.items() if targets} == {}


def test_the_ground_used_above_it_reaches_none_of_it_back():
    """The ground modules the packages above import lead to ground modules only."""
    graph = import_graph()
    used = {
        target
        for name, targets in graph.items()
        if top_level(name) in LOWER_PACKAGES
        for target in targets
        if top_level(target) == "ground"
    }
    assert used, "the lower packages import nothing of the ground: the test would prove nothing"
    for module in sorted(used):
        above = {target for target in reachable(graph, module) if top_level(target) != "ground"}
        assert not above, f"{module} reaches {sorted(above)}"


def test_the_top_level_folders_read_one_way_top_to_bottom():
    """Each top-level folder imports only folders after it in :data:`TOP_DOWN` (issue 56 item 5): the shell
    uses everything, the ground nothing, and pruning, server and loadtest none of each other."""
    rank = {
        package: index
        for index, tier in enumerate(TOP_DOWN)
        for package in ((tier,) if isinstance(tier, str) else tier)
    }
    assert set(rank) == set(PACKAGES)
    upward = sorted(
        f"{name} -> {target}"
        for name, targets in import_graph().items()
        for target in targets
        if top_level(target) != top_level(name) and rank[top_level(target)] <= rank[top_level(name)]
    )
    assert upward == []


SHELL_FOLDER = "depthprune/cli"


def module_folder(name: str, path: Path) -> str:
    """The folder a module lives in, relative to the root; a ``__main__`` module counts with the shell."""
    if path.stem == "__main__":
        return SHELL_FOLDER
    return path.parent.relative_to(ROOT).as_posix()


def folder_graph() -> tuple[dict[str, set[str]], dict[tuple[str, str], list[str]]]:
    """Folders and the folders their modules import, with the module imports behind each edge."""
    modules = module_names()
    graph: dict[str, set[str]] = {}
    reasons: dict[tuple[str, str], list[str]] = {}
    for name, targets in import_graph().items():
        source = module_folder(name, modules[name])
        graph.setdefault(source, set())
        for target in targets:
            folder = module_folder(target, modules[target])
            if folder != source:
                graph[source].add(folder)
                reasons.setdefault((source, folder), []).append(f"{name} -> {target}")
    return graph, reasons


def test_the_folder_graph_counts_each_module_where_it_lives():
    """A module's imports are its folder's; ``depthprune/__main__.py`` is the shell's."""
    graph, reasons = folder_graph()
    assert "pruning/model" in graph["pruning/calibration/scoring"]
    assert ("depthprune/cli", "depthprune/cli") not in reasons
    assert SHELL_FOLDER not in graph["depthprune"]


def test_no_folder_imports_a_folder_that_imports_it_back():
    """Folders are rooms with one-way doors (house style 17), function-level imports included."""
    graph, reasons = folder_graph()
    cycle = find_cycle(graph)
    assert cycle is None, "folder cycle: " + "; ".join(
        f"{source} -> {target} ({', '.join(reasons[source, target][:3])})"
        for source, target in zip(cycle, cycle[1:])
    )
