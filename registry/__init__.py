"""The registry of depth-pruned variants: base models, variants, aliases, evaluations, serving benchmarks.

It is the one shared state between pruning, serving and load tests. SQLite by default (a file under
``DEPTHPRUNE_HOME``), PostgreSQL by URL (``DEPTHPRUNE_REGISTRY_URL`` or ``--registry URL``); the schema is
created and upgraded by Alembic migrations when a registry is opened. Importing this package does not
import torch or vLLM. Command line: ``depthprune variants list|show|compare|alias|export|rm``.
"""

from registry.api import Registry, VariantReference, open_registry
from registry.naming import DENSE
from registry.records import BaseModelInfo, EvaluationInfo, ServingBenchmarkInfo, VariantInfo

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
