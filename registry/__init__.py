"""The registry of depth-pruned variants: base models, variants, aliases, evaluations, serving benchmarks.

It is the one shared state between pruning, serving and load tests. SQLite by default (a file under
``DEPTHPRUNE_HOME``), PostgreSQL by URL (``DEPTHPRUNE_REGISTRY_URL`` or ``--registry URL``); the schema is
created and upgraded by Alembic migrations when a registry is opened. Importing this package does not
import torch or vLLM, nor SQLAlchemy until a name below is used (so ``depthprune --help`` stays fast).
Command line: ``depthprune variants list|show|compare|alias|export|rm``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from registry.api import Registry, VariantReference, open_registry
    from registry.naming import DENSE
    from registry.records import BaseModelInfo, EvaluationInfo, ServingBenchmarkInfo, VariantInfo

_EXPORTS = {
    "DENSE": "registry.naming",
    "BaseModelInfo": "registry.records",
    "EvaluationInfo": "registry.records",
    "Registry": "registry.api",
    "ServingBenchmarkInfo": "registry.records",
    "VariantInfo": "registry.records",
    "VariantReference": "registry.api",
    "open_registry": "registry.api",
}
__all__ = [
    "DENSE",
    "BaseModelInfo",
    "EvaluationInfo",
    "Registry",
    "ServingBenchmarkInfo",
    "VariantInfo",
    "VariantReference",
    "open_registry",
]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'registry' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
