"""The two rooms issue 56 split stay split: the subset scorer's classes and the prune pipeline's modules
small enough to read whole, and the pipeline's functions typed from the config to the registry row."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCORING = ROOT / "pruning/calibration/scoring"
PIPELINE = ROOT / "pruning/pipeline"
PRUNE_STEPS = ("prune.py", "plan.py", "run.py", "register.py")
"""The modules a prune run goes through from its config to the registry row."""


def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def class_spans(folder: Path) -> dict[str, int]:
    """``module:Class`` -> lines from its ``class`` line to its last, for every class in ``folder``."""
    return {
        f"{path.name}:{node.name}": node.end_lineno - node.lineno + 1
        for path in sorted(folder.glob("*.py"))
        for node in ast.walk(parsed(path))
        if isinstance(node, ast.ClassDef)
    }


def test_no_class_in_the_scoring_room_is_over_300_lines():
    """``SubsetEvaluator`` is a façade over collaborators (dense pass, score book, trie walk, packing, KL
    reference), none of them a crowded room again."""
    spans = class_spans(SCORING)
    assert "evaluator.py:SubsetEvaluator" in spans and len(spans) >= 10
    assert {name: lines for name, lines in spans.items() if lines > 300} == {}


def test_the_class_measure_counts_every_line_of_a_class(tmp_path):
    """The measure above sees a class's whole body (docstrings and nested functions included)."""
    body = "\n".join(f"    def method_{index}(self):\n        return {index}\n" for index in range(160))
    (tmp_path / "crowded.py").write_text(f'class Crowded:\n    """Doc."""\n\n{body}')
    assert class_spans(tmp_path) == {"crowded.py:Crowded": 3 + 3 * 160 - 1}


def test_no_file_in_the_pipeline_room_is_over_600_lines():
    """``prune.py`` is split into plan, run and register; no module of the pipeline grows back past 600."""
    sizes = {path.name: len(path.read_text(encoding="utf-8").splitlines()) for path in PIPELINE.glob("*.py")}
    assert {"prune.py", "plan.py", "run.py", "register.py"} <= set(sizes)
    assert {name: lines for name, lines in sizes.items() if lines > 600} == {}


def untyped_parameters(path: Path) -> list[str]:
    """``function(parameter)`` for every parameter of a function in ``path`` without an annotation
    (``self`` and ``cls`` of methods aside)."""
    missing = []
    for node in ast.walk(parsed(path)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        arguments = node.args
        for argument in [
            *arguments.posonlyargs,
            *arguments.args,
            *arguments.kwonlyargs,
            *filter(None, [arguments.vararg, arguments.kwarg]),
        ]:
            if argument.annotation is None and argument.arg not in ("self", "cls"):
                missing.append(f"{path.name}:{node.name}({argument.arg})")
    return missing


def test_every_parameter_from_the_config_to_the_registry_row_is_typed():
    """A data-flow walk of a prune run loses no step to an untyped parameter (``_register``'s were)."""
    assert [name for step in PRUNE_STEPS for name in untyped_parameters(PIPELINE / step)] == []


def test_the_typing_check_finds_an_untyped_parameter(tmp_path):
    path = tmp_path / "steps.py"
    path.write_text("def register(registry, plan: int, *rest, **more: str) -> None:\n    pass\n")
    assert untyped_parameters(path) == ["steps.py:register(registry)", "steps.py:register(rest)"]
