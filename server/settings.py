"""Configuration of the gateway: which backends it fronts, how it starts them, and its limits.

Everything here is a plain dataclass (house style: pydantic only at the HTTP boundary) so that
``create_app(settings)`` can be driven from the command line (``depthprune serve``), a config file
(``--config gateway.yaml``) or a test, and so that a config mistake is a :class:`UserError` raised
before any process is started.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from ground.core.errors import UserError


@dataclass
class VariantMetadata:
    """What ``/v1/models`` says about a variant (from the registry, or only the name for a bare remote)."""

    base_model: str | None = None
    """Hub id or directory of the dense model the variant was pruned from."""
    removed_blocks: list[int] = field(default_factory=list)
    """Original indices of the removed blocks; empty for the dense model."""
    objective: str | None = None
    """Calibration objective that chose the removed blocks (``ppl``, ``margin``, ...); None for dense."""
    variant_id: int | None = None
    """Registry id of the variant, when it came from the registry."""
    num_blocks: int | None = None
    """N, the number of blocks of the base model."""
    calibration_loss: float | None = None
    """Calibration loss of the variant (lower is better), used to pick the best variant of an objective."""
    aliases: list[str] = field(default_factory=list)
    """Registry aliases of the variant (``ppl-best`` ...)."""
    is_dense: bool = False
    """True for the unpruned base model."""
    search: str | None = None
    """Search algorithm that found the removed set."""
    speculative: dict | None = None
    """For a speculative arm: its draft and K (:meth:`SpeculativeDraft.card`); None otherwise."""


def metadata_from_variant(info, served_name: str) -> VariantMetadata:
    """What ``/v1/models`` shows for a registry :class:`VariantInfo`."""
    aliases = [name for name in [info.name, *(info.aliases or [])] if name and name != served_name]
    return VariantMetadata(
        base_model=info.base_model,
        removed_blocks=list(info.removed_blocks or []),
        objective=None if info.is_dense else info.objective,
        variant_id=info.id,
        num_blocks=info.num_blocks,
        calibration_loss=info.calibration_loss,
        aliases=aliases,
        is_dense=bool(info.is_dense),
        search=info.search,
    )


@dataclass(frozen=True)
class EnginePlacement:
    """Where one engine (one replica of a variant) runs on a GPU machine, as the memory plan placed it."""

    gpus: tuple[int, ...]
    """Cards of the engine (its ``CUDA_VISIBLE_DEVICES``), ``tensor_parallel_size`` of them."""
    gpu_memory_utilization: float
    """The engine's share of each of its cards; the shares of all engines on a card sum below 1."""


@dataclass(frozen=True)
class SpeculativeDraft:
    """The draft model of a speculative arm (``serve --speculative NAME=DRAFT[:K]``)."""

    model_dir: str
    """The draft's checkpoint directory (vLLM ``speculative_config["model"]``)."""
    num_speculative_tokens: int
    """K, tokens drafted per step (vLLM ``speculative_config["num_speculative_tokens"]``)."""
    draft: str = ""
    """The draft as given: a registry name, alias or directory."""
    draft_variant_id: int | None = None
    """The draft's registry id, when it came from the registry."""
    target: str = "dense"
    """Registry name of the dense model that verifies the drafts."""

    def __post_init__(self):
        if self.num_speculative_tokens < 1:
            raise UserError(f"num_speculative_tokens must be at least 1, got {self.num_speculative_tokens}")

    def vllm_config(self) -> dict:
        """vLLM's ``--speculative-config`` (field names of ``vllm.config.speculative.SpeculativeConfig``)."""
        return {
            "method": "draft_model",
            "model": self.model_dir,
            "num_speculative_tokens": self.num_speculative_tokens,
        }

    def card(self) -> dict:
        """What ``/v1/models`` says about it."""
        return {
            "draft": self.draft,
            "num_speculative_tokens": self.num_speculative_tokens,
            "target": self.target,
        }


@dataclass
class BackendSpec:
    """One variant served by one vLLM OpenAI server: started here (``model_dir``) or remote (``url``)."""

    name: str
    """Name clients send as ``model``; also the vLLM ``--served-model-name`` of a managed backend."""
    model_dir: str | None = None
    """Checkpoint directory (or hub id) to start a local vLLM server for; None for a remote backend."""
    url: str | None = None
    """Base URL (``http://host:port``) of an already running vLLM server; None for a managed backend."""
    metadata: VariantMetadata = field(default_factory=VariantMetadata)
    """Registry facts shown by ``/v1/models``."""
    tensor_parallel_size: int = 1
    """GPUs one engine of this variant spans (vLLM ``--tensor-parallel-size``)."""
    replicas: int = 1
    """Engines (one vLLM process each, own port) serving this variant; the gateway spreads its requests
    over those that are up. Managed backends only: a remote URL is one server."""
    placements: tuple[EnginePlacement, ...] = ()
    """Cards and memory share of each replica's engine, from the memory plan (one per replica); empty: the
    pool's default share and whatever cards the processes see."""
    speculative: SpeculativeDraft | None = None
    """A speculative arm's draft model; None for a plain variant."""

    def __post_init__(self):
        if not self.name or "/" in self.name or " " in self.name:
            raise UserError(f"invalid variant name {self.name!r}: use letters, digits, '-', '_' or '.'")
        if (self.model_dir is None) == (self.url is None):
            raise UserError(f"variant {self.name!r}: give exactly one of a model directory or a URL")
        if self.url is not None:
            parsed = urlparse(self.url)
            if parsed.scheme not in ("http", "https") or not parsed.netloc:
                raise UserError(f"variant {self.name!r}: {self.url!r} is not an http(s)://host:port URL")
            self.url = self.url.rstrip("/")
        if self.replicas < 1 or (self.replicas > 1 and not self.managed):
            raise UserError(
                f"variant {self.name!r}: replicas must be >= 1, and only a variant started here has more"
            )
        if self.placements and len(self.placements) != self.replicas:
            raise UserError(
                f"variant {self.name!r}: {len(self.placements)} placements for {self.replicas} replicas"
            )

    @property
    def managed(self) -> bool:
        """True when the gateway starts (and restarts) this backend's process itself."""
        return self.model_dir is not None


@dataclass
class VllmOptions:
    """How managed vLLM server processes are started (one per variant, one after another)."""

    dtype: str = "auto"
    """``--dtype`` of every process (``auto``, ``float32``, ``bfloat16``, ``float16``)."""
    max_model_len: int | None = None
    """``--max-model-len``; None keeps the model's own context length."""
    kv_cache_gib: int = 1
    """CPU build: KV-cache size per process in whole GiB (``VLLM_CPU_KVCACHE_SPACE``)."""
    gpu_memory_utilization: float | None = None
    """GPU build: memory fraction per process; None divides 0.9 evenly between the managed processes."""
    max_num_seqs: int | None = None
    """``--max-num-seqs`` (concurrent sequences per process); None keeps vLLM's default."""
    start_timeout_s: float = 300.0
    """Seconds to wait for a process to answer ``/health`` before giving up with its log tail."""
    first_port: int | None = None
    """First port for the processes (consecutive); None picks free ports."""
    log_dir: str | None = None
    """Directory for the processes' logs; None uses ``DEPTHPRUNE_HOME/logs``."""
    extra_args: list[str] = field(default_factory=list)
    """More ``vllm.entrypoints.openai.api_server`` arguments, passed to every process as is."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables of every process (e.g. ``VLLM_CPU_OMP_THREADS_BIND``)."""
    server_module: str = "vllm.entrypoints.openai.api_server"
    """Python module run as ``python -m MODULE --model DIR --served-model-name NAME --port P ...``."""

    def __post_init__(self):
        if self.dtype not in ("auto", "float32", "bfloat16", "float16", "half", "float"):
            raise UserError(f"unknown dtype {self.dtype!r}: use auto, float32, bfloat16 or float16")
        if self.max_model_len is not None and self.max_model_len < 16:
            raise UserError(f"max_model_len must be at least 16, got {self.max_model_len}")
        if int(self.kv_cache_gib) != self.kv_cache_gib or self.kv_cache_gib < 1:
            raise UserError(f"kv_cache_gib must be a whole number of GiB >= 1, got {self.kv_cache_gib}")
        self.kv_cache_gib = int(self.kv_cache_gib)
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise UserError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.start_timeout_s <= 0:
            raise UserError(f"start_timeout_s must be positive, got {self.start_timeout_s}")
        if self.first_port is not None and not 1 <= self.first_port <= 65535:
            raise UserError(f"first_port must be a TCP port, got {self.first_port}")


POSITIVE_DURATIONS = (
    "request_timeout_s",
    "connect_timeout_s",
    "upstream_keepalive_s",
    "body_timeout_s",
    "health_interval_s",
    "health_timeout_s",
    "experiments_poll_s",
    "series_interval_s",
)


@dataclass
class GatewaySettings:
    """Everything :func:`server.app.create_app` needs."""

    backends: list[BackendSpec]
    """The variants to serve, in start order."""
    experiments: dict[str, dict[str, Any]] = field(default_factory=dict)
    """A/B experiments by name, each ``{"arms": [...], ...}`` (see :mod:`server.experiments`)."""
    vllm: VllmOptions = field(default_factory=VllmOptions)
    """How managed backends are started."""
    host: str = "127.0.0.1"
    """Interface the gateway listens on."""
    port: int = 8000
    """Port the gateway listens on."""
    api_key: str | None = None
    """When set, ``/v1/*`` requests need ``Authorization: Bearer <api_key>``."""
    admin_token: str | None = None
    """When set, enables ``/admin/*`` (runtime experiment changes) behind this bearer token."""
    metrics_auth: bool = False
    """Require the API key on ``/metrics`` and ``/metrics/backends/*`` too (open by default, as Prometheus
    scrapes usually are); needs ``api_key``."""
    max_body_bytes: int = 1 << 20
    """Largest request body accepted; larger bodies get 413."""
    request_timeout_s: float = 600.0
    """Longest a backend may take between two bytes of a response before the request fails with 503."""
    connect_timeout_s: float = 5.0
    """Longest a connection to a backend may take."""
    upstream_keepalive_s: float = 2.0
    """Idle connections to the backends are closed after this many seconds. Keep it below the backends'
    own keep-alive (vLLM: 5 s, uvicorn's default), so that the gateway never sends a request on a
    connection the backend is closing."""
    body_timeout_s: float = 30.0
    """Longest a client may take to send its request body; a stalled body gets 408."""
    health_interval_s: float = 5.0
    """Seconds between health checks of every backend."""
    health_timeout_s: float = 3.0
    """A backend whose ``/health`` takes longer than this is marked down."""
    restart: bool = True
    """Restart a managed backend that died or stopped answering."""
    user_header: str = "x-depthprune-user"
    """Header carrying the sticky user key when the body has no ``user`` field."""
    arm_header: str = "x-depthprune-arm"
    """Header forcing an experiment arm by name."""
    experiments_registry: str | None = None
    """Registry URL whose experiments this gateway shares with every other gateway on it (versions, history,
    changes reach all replicas within about ``experiments_poll_s``); None keeps them in this process."""
    experiments_poll_s: float = 1.0
    """Seconds between two reads of the registry's experiment versions (PostgreSQL also notifies at once)."""
    shadow_queue_size: int = 256
    """Completions waiting to be shadow-scored by their experiment's control (``shadow_rate``); one more is
    dropped and counted (``depthprune_gateway_shadow_dropped_total{reason="queue_full"}``)."""
    shadow_workers: int = 2
    """Shadow scoring requests this gateway sends at once (to all controls together)."""
    shadow_max_control_in_flight: int = 16
    """A completion is not scored (dropped, ``control_busy``) while the control's least loaded engine has
    this many requests outstanding from this gateway: users' requests come first."""
    shadow_timeout_s: float = 30.0
    """Longest one scoring request may take before it is dropped (``failed``)."""
    guardrail_interval_s: float = 1.0
    """Seconds between two checks of the experiments' guardrails against this gateway's statistics."""
    series_interval_s: float = 10.0
    """Seconds between two samples of every experiment's per-arm figures, which the experiment page (``/ui/``)
    draws over time (:mod:`server.experiment_series`)."""
    series_points: int = 720
    """Most points kept per experiment for the page; when full, every other one goes (bounded memory)."""
    peers: list[str] = field(default_factory=list)
    """Base URLs of the other gateway replicas whose ``/metrics`` this gateway adds to its own for the page's
    figures (``http://gw-2:8000``); empty: the page shows this gateway's traffic only."""

    def __post_init__(self):
        if not self.backends:
            raise UserError("no variants to serve: pass --variants (e.g. dense,ppl-best)")
        names = [backend.name for backend in self.backends]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise UserError(f"variant listed twice: {', '.join(duplicates)}")
        clashes = sorted(set(names) & set(self.experiments))
        if clashes:
            raise UserError(f"experiment name equals a variant name: {', '.join(clashes)}")
        if not 1 <= self.port <= 65535:
            raise UserError(f"port must be in 1..65535, got {self.port}")
        for name in ("shadow_queue_size", "shadow_workers", "shadow_max_control_in_flight"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise UserError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        for name in ("shadow_timeout_s", "guardrail_interval_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not 0 < value < float("inf"):
                raise UserError(f"{name} must be a positive number of seconds, got {value!r}")
        if self.max_body_bytes < 1024:
            raise UserError(f"max_body_bytes must be at least 1024, got {self.max_body_bytes}")
        for name in POSITIVE_DURATIONS:
            value = getattr(self, name)
            if not (isinstance(value, int | float) and 0 < value < float("inf")):
                raise UserError(f"{name} must be a positive number of seconds, got {value!r}")
        if not isinstance(self.series_points, int) or self.series_points < 2:
            raise UserError(f"series_points must be an integer of at least 2, got {self.series_points!r}")
        for peer in self.peers:
            if urlparse(str(peer)).scheme not in ("http", "https") or not urlparse(str(peer)).netloc:
                raise UserError(f"peers: {peer!r} is not an http(s)://host:port URL")
        if self.metrics_auth and not self.api_key:
            raise UserError("metrics_auth (--metrics-auth) needs an API key (--api-key) to require")


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a gateway config file (YAML or JSON): ``variants``, ``experiments``, ``vllm`` and gateway keys.

    Raises:
        UserError: the file is missing, unreadable or not a mapping.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"config file {path} does not exist")
    import yaml

    text = path.read_text()
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as error:
        raise UserError(
            f"config file {path} is not valid {path.suffix.lstrip('.') or 'YAML'}: "
            f"{str(error).splitlines()[0]}"
        ) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(f"config file {path} must hold a mapping (variants:, experiments:, ...)")
    known = {
        "variants",
        "experiments",
        "vllm",
        "host",
        "port",
        "api_key",
        "admin_token",
        "metrics_auth",
        "max_body_bytes",
        "request_timeout_s",
        "upstream_keepalive_s",
        "body_timeout_s",
        "health_interval_s",
        "restart",
        "registry",
        "experiments_poll_s",
        "allow_unfit",
        "speculative",
        "peers",
        "series_interval_s",
    }
    unknown = sorted(set(data) - known)
    if unknown:
        raise UserError(
            f"config file {path}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    return data
