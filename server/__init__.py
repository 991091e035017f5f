"""The serving gateway: every registered variant through vLLM behind one OpenAI-compatible API.

``depthprune serve --variants dense,ppl-best,margin-best`` resolves the names in the registry, starts one
vLLM OpenAI server per variant (``--replicas N``: N of them, requests to the least busy) or uses
``name=http://host:port`` backends, and serves a FastAPI gateway
in front with A/B experiments by calibration objective, Prometheus metrics and health checks.
Importing this package imports neither torch nor vLLM.
"""

from server.app import build_router, create_app
from server.backends import Backend, BackendPool, BackendStartError
from server.experiments import Route, Router, RoutingError, unit_hash
from server.launch import serve_gateway
from server.protocol import ArmSpec, ExperimentSpec
from server.replicas import ReplicaSet
from server.settings import (
    BackendSpec,
    EnginePlacement,
    GatewaySettings,
    VariantMetadata,
    VllmOptions,
    load_config_file,
)

__all__ = [
    "ArmSpec",
    "Backend",
    "BackendPool",
    "BackendSpec",
    "BackendStartError",
    "EnginePlacement",
    "ExperimentSpec",
    "GatewaySettings",
    "ReplicaSet",
    "Route",
    "Router",
    "RoutingError",
    "VariantMetadata",
    "VllmOptions",
    "build_router",
    "create_app",
    "load_config_file",
    "serve_gateway",
    "unit_hash",
]
