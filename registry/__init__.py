"""The registry of depth-pruned variants: base models, variants, aliases, evaluations, serving benchmarks,
and the work queue of distributed studies.

It is the one shared state between pruning, serving and load tests. SQLite by default (a file under
``DEPTHPRUNE_HOME``), PostgreSQL by URL (``DEPTHPRUNE_REGISTRY_URL`` or ``--registry URL``); the schema is
created and upgraded by Alembic migrations when a registry is opened. Importing this package does not
import torch or vLLM, nor SQLAlchemy until a name below is used (so ``depthprune --help`` stays fast).
Command line: ``depthprune variants list|show|compare|alias|export|rm``.
"""

from __future__ import annotations

from ground.core.lazy import lazy_exports

_EXPORTS = {
    "DENSE": "registry.naming",
    "BaseModelInfo": "registry.records",
    "EvaluationInfo": "registry.records",
    "Registry": "registry.api",
    "ServingBenchmarkInfo": "registry.records",
    "VariantInfo": "registry.records",
    "VariantRecord": "registry.records",
    "VariantReference": "registry.api",
    "WorkQueue": "registry.work_queue",
    "open_registry": "registry.api",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
