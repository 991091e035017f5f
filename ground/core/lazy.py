"""Lazy re-exports for package ``__init__`` files: public names without importing torch up front.

``pruning`` and its sub-packages re-export their public names (``from pruning import prune``), as optuna's
packages do, but most of them pull in torch and transformers. Resolving each name on first attribute access
(PEP 562) keeps ``import pruning.cli.commands`` — and so ``depthprune --help`` — fast.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(
    package: str, names: dict[str, str]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package`` that import ``names[attr]`` (a module) on first use.

    Args:
        package: the ``__name__`` of the package whose ``__init__`` calls this.
        names: public name -> module (absolute) that defines it.

    Returns:
        The module-level ``__getattr__`` and ``__dir__`` functions to assign in the package.
    """

    def __getattr__(attribute: str) -> object:
        if attribute not in names:
            raise AttributeError(f"module {package!r} has no attribute {attribute!r}")
        return getattr(importlib.import_module(names[attribute]), attribute)

    def __dir__() -> list[str]:
        return sorted(names)

    return __getattr__, __dir__
