"""``depthprune serve``: resolve variants in the registry, start one vLLM server each, serve the gateway.

Example::

    depthprune serve --variants dense,ppl-best,margin-best --port 8000 --config ab.yaml --admin-token s3cret
    depthprune serve --variants dense=http://gpu-1:8001,ppl-best=http://gpu-2:8001

The typer signature below is the command line; this module turns it (and ``--config``) into
:class:`~server.settings.GatewaySettings`, resolving each name in the registry, and hands them to
:func:`server.launch.serve_gateway`, which starts the processes and serves. Before every start and restart
of a managed backend, its directory is compared with the manifest the registry took at registration
(:func:`registered_files_check`): a changed, missing or added model file keeps that backend down.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from ground.core.cli_options import Override, cli, option_group, with_options
from ground.core.errors import UserError
from ground.core.options import JsonOptions, PlanOptions, RegistryOptions
from server.backends import is_cpu_build
from server.launch import gateway_summary, serve_gateway
from server.settings import (
    BackendSpec,
    GatewaySettings,
    VariantMetadata,
    VllmOptions,
    load_config_file,
    metadata_from_variant,
)
from server.sizing import SizingRequest, size_engines
from server.speculative import parse_speculative, speculative_backends


def parse_variant_list(text: str) -> list[tuple[str, str | None]]:
    """``"dense,ppl-best,x=http://h:1"`` -> ``[("dense", None), ("ppl-best", None), ("x", "http://h:1")]``.

    Raises:
        UserError: an empty list or an empty item.
    """
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise UserError(f"--variants {text!r}: give comma-separated names, e.g. dense,ppl-best,margin-best")
    parsed = []
    for item in items:
        name, sep, url = item.partition("=")
        parsed.append((name.strip(), url.strip() if sep else None))
    return parsed


def resolve_backends(
    variants: list[tuple[str, str | None]], registry_url: str | None, allow_unfit: bool = False
) -> list[BackendSpec]:
    """Registry lookups (and checkpoint checks) for every variant, before anything is started.

    Raises:
        UserError: an unknown name, a checkpoint missing on disk or whose checksum changed, a variant
            listed twice under two names, a variant the quality gate found unfit (without ``allow_unfit``).
    """
    registry = None
    needs_registry = any(url is None for _, url in variants)
    if needs_registry:
        from registry import open_registry

        registry = open_registry(registry_url)
    specs, seen_ids = [], {}
    for name, url in variants:
        if url is not None:
            metadata = VariantMetadata()
            if registry is not None:
                try:  # a remote backend named like a registry variant gets its facts too
                    metadata = metadata_from_variant(registry.resolve(name), name)
                except UserError:
                    pass
            specs.append(BackendSpec(name=name, url=url, metadata=metadata))
            continue
        info = registry.resolve(name)
        if info.fit is False and not allow_unfit:
            reasons = "; ".join((info.quality or {}).get("reasons", [])) or "unfit"
            raise UserError(
                f"variant {name!r} ({info.name}) is unfit ({reasons}): not served; pass --allow-unfit to "
                f"serve it anyway"
            )
        if info.id in seen_ids and not info.is_dense:
            raise UserError(f"{name!r} and {seen_ids[info.id]!r} are the same variant; serve it once")
        seen_ids[info.id] = name
        path = info.checkpoint_path
        if not path:
            raise UserError(f"variant {name!r} has no checkpoint; write one with `depthprune checkpoint`")
        local = Path(path).expanduser()
        if local.exists():
            if not local.is_dir():
                raise UserError(f"checkpoint of {name!r} is not a directory: {local}")
            try:
                registry.verify_checkpoint(info)
            except UserError as error:
                raise UserError(f"cannot serve {name!r}: {error}") from None
            path = str(local)
        elif not info.is_dense or path.startswith((".", "/", "~")):
            raise UserError(f"checkpoint of variant {name!r} is missing: {path}")
        specs.append(BackendSpec(name=name, model_dir=path, metadata=metadata_from_variant(info, name)))
    return specs


def registered_files_check(
    settings: GatewaySettings, registry_url: str | None
) -> Callable[[str], None] | None:
    """The check run before every start of a managed backend: its directory still holds the files the
    registry hashed at registration (:func:`registry.integrity.check_model_files`).

    The registry's records are read once, here; a restart needs no registry, only the files.

    Args:
        settings: the gateway's settings, from :func:`build_settings`.
        registry_url: the registry the variants were resolved in.

    Returns:
        ``check(name)``, raising :class:`UserError` with the reason; None when nothing is managed.
    """
    specs = {spec.name: spec for spec in settings.backends if spec.managed}
    if not specs:
        return None
    from registry import open_registry
    from registry.integrity import check_model_files

    with open_registry(registry_url) as registry:
        # A speculative arm is its dense model's files, and its draft's when the draft is registered.
        infos = {
            name: registry.resolve(spec.speculative.target if spec.speculative else name)
            for name, spec in specs.items()
        }
        drafts = {
            name: registry.resolve(spec.speculative.draft)
            for name, spec in specs.items()
            if spec.speculative is not None and spec.speculative.draft_variant_id is not None
        }

    def check(name: str) -> None:
        info, directory = infos[name], specs[name].model_dir
        if name in drafts:
            draft = drafts[name]
            registered = dict(files=draft.checkpoint_files, weights_checksum=draft.checkpoint_sha256)
            check_model_files(specs[name].speculative.model_dir, draft.qualified_name, **registered)
        if info.is_dense and not directory.startswith((".", "/", "~")):
            return  # a hub id: vLLM fetches the pinned revision itself
        registered = dict(files=info.checkpoint_files, weights_checksum=info.checkpoint_sha256)
        check_model_files(directory, info.qualified_name, **registered)

    return check


def build_settings(options: dict[str, Any], file_config: dict[str, Any]) -> GatewaySettings:
    """GatewaySettings from command-line options (None = not given) over the config file's values."""

    def pick(key: str, default=None):
        value = options.get(key)
        return value if value is not None else file_config.get(key, default)

    variants_value = options.get("variants") or file_config.get("variants")
    if isinstance(variants_value, list):
        variants_value = ",".join(str(v) for v in variants_value)
    if not variants_value:
        raise UserError(
            "no variants to serve: pass --variants dense,ppl-best or list `variants:` in --config"
        )
    variant_list = parse_variant_list(variants_value)
    backends = resolve_backends(variant_list, pick("registry"), bool(pick("allow_unfit", False)))
    speculative_value = pick("speculative")
    if isinstance(speculative_value, list):
        speculative_value = ",".join(str(item) for item in speculative_value)
    max_model_len = options.get("max_model_len") or (file_config.get("vllm") or {}).get("max_model_len")
    backends += speculative_backends(
        parse_speculative(speculative_value), backends, pick("registry"), max_model_len
    )
    vllm_config = dict(file_config.get("vllm") or {})
    for key in (
        "dtype",
        "max_model_len",
        "kv_cache_gib",
        "gpu_memory_utilization",
        "start_timeout_s",
        "first_port",
        "log_dir",
    ):
        if options.get(key) is not None:
            vllm_config[key] = options[key]
    if options.get("vllm_args"):
        vllm_config["extra_args"] = [*vllm_config.get("extra_args", []), *options["vllm_args"]]
    try:
        vllm = VllmOptions(**vllm_config)
    except TypeError as error:
        raise UserError(f"config `vllm:` section: {error}") from None
    return GatewaySettings(
        backends=backends,
        experiments=dict(file_config.get("experiments") or {}),
        vllm=vllm,
        host=pick("host", "127.0.0.1"),
        port=int(pick("port", 8000)),
        api_key=pick("api_key"),
        admin_token=pick("admin_token"),
        metrics_auth=bool(pick("metrics_auth", False)),
        max_body_bytes=int(pick("max_body_bytes", 1 << 20)),
        request_timeout_s=float(pick("request_timeout_s", 600.0)),
        upstream_keepalive_s=float(pick("upstream_keepalive_s", 2.0)),
        body_timeout_s=float(pick("body_timeout_s", 30.0)),
        health_interval_s=float(pick("health_interval_s", 5.0)),
        restart=bool(pick("restart", True)),
        experiments_registry=experiments_registry(pick("registry"), variant_list),
        experiments_poll_s=float(pick("experiments_poll_s", 1.0)),
        peers=list(pick("peers", [])),
        series_interval_s=float(pick("series_interval_s", 10.0)),
    )


def experiments_registry(registry_url: str | None, variants: list[tuple[str, str | None]]) -> str | None:
    """The registry whose experiments the gateway shares: the one it was given (``--registry``, config
    ``registry:``, ``DEPTHPRUNE_REGISTRY_URL``) or resolves variants in; None (this process only) for a
    gateway of remote backends told of no registry."""
    import os

    from ground.core.settings import default_registry_url

    if registry_url:
        return registry_url
    if os.environ.get("DEPTHPRUNE_REGISTRY_URL") or any(url is None for _, url in variants):
        return default_registry_url()
    return None


@option_group
@dataclass(frozen=True)
class ServeOptions:
    """``serve``'s own options, as typed; None = not given, so that ``--config``'s value (or the default in
    brackets) holds (:func:`build_settings`)."""

    variants: str | None = None
    """Comma-separated variants to serve: registry names or aliases (dense, ppl-best, margin-best) started
    here, or name=http://host:port for a vLLM server running elsewhere."""
    host: str | None = None
    """Interface to listen on [default: 127.0.0.1]."""
    port: int | None = None
    """Port of the gateway [default: 8000]."""
    config: Path | None = None
    """YAML/JSON file with `variants`, `experiments` (A/B arms by objective or variant), `vllm` options and
    gateway settings; command-line options win."""
    api_key: str | None = field(default=None, metadata=cli(envvar="DEPTHPRUNE_API_KEY"))
    """Require 'Authorization: Bearer KEY' on /v1/*."""
    admin_token: str | None = field(default=None, metadata=cli(envvar="DEPTHPRUNE_ADMIN_TOKEN"))
    """Enable /admin/experiments behind this bearer token."""
    metrics_auth: bool | None = field(default=None, metadata=cli("--metrics-auth/--no-metrics-auth"))
    """Require the API key on /metrics and /metrics/backends/* too [default: open, as Prometheus scrapes
    usually are]."""
    dtype: str | None = None
    """vLLM --dtype of every process (auto, float32, bfloat16; auto is float32 on the CPU build, where vLLM's
    own auto casts to bfloat16, emulated without AVX512-BF16/AMX)."""
    max_model_len: int | None = None
    """vLLM --max-model-len of every process."""
    kv_cache_gib: int | None = None
    """CPU build: KV cache per process in GiB (VLLM_CPU_KVCACHE_SPACE) [default: 1]."""
    gpu_memory_utilization: float | None = None
    """GPU build: memory fraction per process [default: 0.9 / number of processes]."""
    start_timeout: float | None = None
    """Seconds to wait for each vLLM process to become healthy [default: 300]."""
    first_port: int | None = None
    """First port of the vLLM processes [default: free]."""
    vllm_arg: list[str] | None = None
    """Extra argument for every vLLM process, repeatable: --vllm-arg=--enforce-eager."""
    log_level: str = "info"
    """Gateway log level (debug, info, warning)."""
    tensor_parallel: str | None = None
    """GPUs per engine (vLLM --tensor-parallel-size): N for every variant or NAME=N,...."""
    replicas: str | None = None
    """Engines per variant, each its own vLLM process (and on a GPU machine its own cards); the gateway sends
    each request to the replica with the fewest outstanding: N for every variant or NAME=N,... [default:
    1]."""
    allow_unfit: bool = field(default=False, metadata=cli("--allow-unfit"))
    """Serve variants (and A/B arms) the quality gate marked fit: false; refused by default."""
    speculative: str | None = None
    """Speculative arms: NAME=DRAFT[:K],... serves the dense model as NAME with DRAFT (a registry variant,
    alias or checkpoint directory of the same base and vocabulary) as vLLM's draft model, K drafted tokens per
    step (default 5). Greedy output equals dense's; NAME routes like any variant."""

    def settings_options(self, registry: str | None) -> dict[str, Any]:
        """The options :func:`build_settings` lays over the config file (None = not given), by its names."""
        return {
            **dataclasses.asdict(self),
            "registry": registry,
            "start_timeout_s": self.start_timeout,
            "vllm_args": self.vllm_arg or [],
            "allow_unfit": self.allow_unfit or None,
        }


ServeJson = Annotated[
    JsonOptions,
    Override(as_json="Print one JSON line {url, variants, experiments} once serving, instead of text."),
]
"""``serve --json``: what it prints."""


@with_options
def serve(options: ServeOptions, where: RegistryOptions, plan: PlanOptions, output: ServeJson) -> None:
    """Serve variants through vLLM behind one OpenAI-compatible gateway with A/B routing and metrics.

    Each name is resolved in the registry (checkpoint checksum verified) and gets its own vLLM OpenAI
    server process (--replicas: several, requests go to the least busy), started one after another and
    waited for; then the gateway listens on HOST:PORT with
    /v1/completions, /v1/chat/completions, /v1/models, /metrics, /health and /ready. Ctrl-C stops all.
    """
    file_config = load_config_file(options.config) if options.config is not None else {}
    settings = build_settings(options.settings_options(where.registry), file_config)
    sizing = SizingRequest(
        dry_run=plan.dry_run,
        gpus=plan.gpus,
        gpu_memory_gib=plan.gpu_memory_gib,
        tensor_parallel=options.tensor_parallel,
        replicas=options.replicas,
        as_json=output.as_json,
    )
    settings = size_engines(settings, sizing, gpu_build=not is_cpu_build())
    serve_gateway(
        settings,
        log_level=options.log_level,
        show_progress=not output.as_json,
        on_ready=lambda pool: print_ready(gateway_summary(settings, pool), pool, output.as_json),
        check_before_start=registered_files_check(settings, where.registry or file_config.get("registry")),
    )


def print_ready(summary: dict, pool, as_json: bool) -> None:
    """Say where the gateway serves: one JSON line on stdout, or each backend's state and the URL on stderr.

    Args:
        summary: :func:`server.launch.gateway_summary` of the started gateway.
        pool: its started backends.
        as_json: print the summary as one JSON line instead of text.
    """
    if as_json:
        print(json.dumps({**summary, "ui": f"{summary['url']}/ui/"}), flush=True)
        return
    for name, backend in pool.backends.items():
        state = "up" if backend.up else f"DOWN ({backend.last_error})"
        where = backend.url
        if backend.placement is not None:
            where += f" (GPU {','.join(map(str, backend.placement.gpus))})"
        print(f"  {name:<20} {where:<28} {state}", file=sys.stderr)
    url = summary["url"]
    print(f"gateway listening on {url} (OpenAI API at {url}/v1)", file=sys.stderr, flush=True)
    print(f"experiments page at {url}/ui/ (admin token or API key)", file=sys.stderr, flush=True)
