"""benchmarks/ is a package run as ``python -m benchmarks.NAME`` that imports the library (house style 19)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
MODULES = sorted(path.stem for path in BENCHMARKS.glob("*.py") if path.stem != "__init__")


def test_benchmarks_is_a_package():
    assert (BENCHMARKS / "__init__.py").is_file()
    assert len(MODULES) > 10


def test_no_benchmark_edits_sys_path():
    """They import each other as ``benchmarks.X``, never by putting benchmarks/ on the path."""
    offenders = [
        str(path.relative_to(ROOT))
        for path in BENCHMARKS.iterdir()
        if path.suffix in (".py", ".sh")
        and re.search(r"sys\.path\.(insert|append|extend)|sys\.path *\+?=|PYTHONPATH=", path.read_text())
    ]
    assert offenders == []


def test_commands_run_benchmarks_as_modules():
    """No doc or script runs a benchmark as a file (``python benchmarks/x.py``): the module form is it."""
    texts = [
        ROOT / "README.md",
        *ROOT.glob("docs/*.md"),
        *BENCHMARKS.iterdir(),
        *ROOT.glob("pruning/**/*.py"),
    ]
    offenders = [
        f"{path.relative_to(ROOT)}: {match.group(0)}"
        for path in texts
        if path.is_file() and path.suffix in (".md", ".py", ".sh")
        for match in re.finditer(r"(python|PYTHON\"?) +benchmarks/\w+\.py", path.read_text())
    ]
    assert offenders == []


def test_every_benchmark_module_imports():
    """One fresh interpreter imports them all (the heavy engines they use are imported lazily or not run)."""
    code = f"import importlib\nfor name in {MODULES!r}:\n    importlib.import_module('benchmarks.' + name)\n"
    completed = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert completed.returncode == 0, completed.stderr[-3000:]


@pytest.mark.parametrize("name", ["carryover", "study_reading"])
def test_a_benchmark_runs_as_a_module(name):
    completed = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "usage:" in completed.stdout
