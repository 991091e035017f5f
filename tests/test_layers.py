"""The declared layers hold: import-linter's contracts pass, and the light packages stay light."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from depthprune.testing.imports import heavy_modules_loaded

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept():
    """``lint-imports`` keeps pyproject.toml's contracts: the layers; no torch or vLLM under the gateway."""
    linter = Path(sys.executable).with_name("lint-imports")
    completed = subprocess.run([str(linter)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-2000:]
    assert "0 broken" in completed.stdout


@pytest.mark.parametrize("package", ["registry", "server", "loadtest", "depthprune", "ground", "pruning"])
def test_light_packages_load_no_engine(package):
    """A package imported in a fresh interpreter (the gateway side: its whole API) loads no engine."""
    code = (
        f"import {package}\n"
        f"[getattr({package}, name) for name in getattr({package}, '__all__', [])"
        f" if {package!r} in ('registry', 'server', 'loadtest')]"
    )
    assert heavy_modules_loaded(code) == []


def test_no_source_file_is_over_800_lines():
    """Modules stay small enough to read: package code, tests and benchmarks alike (house style)."""
    folders = ("pruning", "registry", "server", "loadtest", "depthprune", "ground", "tests", "benchmarks")
    sizes = {
        str(path.relative_to(ROOT)): len(path.read_text(encoding="utf-8").splitlines())
        for folder in folders
        for path in (ROOT / folder).rglob("*.py")
    }
    assert len(sizes) > 100
    assert {path: lines for path, lines in sizes.items() if lines > 800} == {}


def test_no_function_in_the_product_packages_is_over_80_lines():
    """Functions stay short enough to read whole (house style 16): signature, docstring and body together."""
    import ast

    sizes = {}
    for folder in ("pruning", "registry", "server", "loadtest", "depthprune", "ground"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    sizes[f"{path.relative_to(ROOT)}:{node.name}"] = node.end_lineno - node.lineno + 1
    assert len(sizes) > 500
    assert {name: lines for name, lines in sizes.items() if lines > 80} == {}
