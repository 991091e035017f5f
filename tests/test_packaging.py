"""Packaging checks: the Dockerfiles lint clean, and CI runs exactly the README's test command."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.cpu"])
def test_dockerfile_lints_clean(dockerfile):
    hadolint = shutil.which("hadolint") or str(Path(__file__).resolve().parents[1] / ".venv/bin/hadolint")
    result = subprocess.run([hadolint, "--no-color", str(ROOT / dockerfile)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci_commands = [
        line.strip()
        for line in (ROOT / ".ci/run").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert "make test" in readme
    assert ci_commands[-1] == "make test"


def test_lock_pins_every_direct_dependency():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    locked = {
        line.split("==")[0].lower().replace("_", "-")
        for line in (ROOT / "requirements/cpu.lock").read_text().splitlines()
        if "==" in line
    }
    wanted = list(project["dependencies"])
    for extra in ("prune", "cpu", "dev", "postgres"):
        wanted += [d for d in project["optional-dependencies"][extra] if not d.startswith("depthprune")]
    for requirement in wanted:
        name = requirement.split("[")[0]
        for separator in "<>=!~ ":
            name = name.split(separator)[0]
        assert name.lower().replace("_", "-") in locked, f"{name} is not pinned in requirements/cpu.lock"


def test_every_package_data_pattern_names_files_that_exist():
    """A pattern matching nothing ships nothing: a wheel (the Dockerfiles install one) lacks the files."""
    import tomllib

    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for package, globs in patterns.items():
        for pattern in globs:
            assert list((ROOT / package).glob(pattern)), f"{package}: {pattern} matches no file"
