"""``depthprune serve``: resolve variants in the registry, start one vLLM server each, serve the gateway.

Example::

    depthprune serve --variants dense,ppl-best,margin-best --port 8000 --config ab.yaml --admin-token s3cret
    depthprune serve --variants dense=http://gpu-1:8001,ppl-best=http://gpu-2:8001

The typer signature below is the command line; heavy work (registry, processes, uvicorn) happens inside.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from depthprune.errors import UserError


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


def metadata_from_variant(info, served_name: str):
    """What ``/v1/models`` shows for a registry :class:`VariantInfo`."""
    from server.settings import VariantMetadata

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


def resolve_backends(variants: list[tuple[str, str | None]], registry_url: str | None) -> list:
    """Registry lookups (and checkpoint checks) for every variant, before anything is started.

    Raises:
        UserError: an unknown name, a checkpoint missing on disk or whose checksum changed, a variant
            listed twice under two names.
    """
    from server.settings import BackendSpec, VariantMetadata

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


def build_settings(options: dict[str, Any], file_config: dict[str, Any]):
    """GatewaySettings from command-line options (None = not given) over the config file's values."""
    from server.settings import GatewaySettings, VllmOptions

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
    backends = resolve_backends(parse_variant_list(variants_value), pick("registry"))
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
        max_body_bytes=int(pick("max_body_bytes", 1 << 20)),
        request_timeout_s=float(pick("request_timeout_s", 600.0)),
        health_interval_s=float(pick("health_interval_s", 5.0)),
        restart=bool(pick("restart", True)),
    )


def listen_socket(host: str, port: int):
    """The gateway's listening socket, bound now: a taken port is a UserError before engines start for
    minutes, and clients that connect once ``serve`` says it is ready are queued, never refused."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as error:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port}: {error.strerror}; pick another --port") from None
    return sock


def serve(
    variants: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated variants to serve: registry names or aliases "
            "(dense, ppl-best, margin-best) started here, or name=http://host:port for a vLLM server "
            "running elsewhere."
        ),
    ] = None,
    registry: Annotated[
        str | None,
        typer.Option(
            help="Registry URL (default: DEPTHPRUNE_REGISTRY_URL or the SQLite file in DEPTHPRUNE_HOME)."
        ),
    ] = None,
    host: Annotated[str | None, typer.Option(help="Interface to listen on [default: 127.0.0.1].")] = None,
    port: Annotated[int | None, typer.Option(help="Port of the gateway [default: 8000].")] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            help="YAML/JSON file with `variants`, `experiments` (A/B arms by objective or variant), "
            "`vllm` options and gateway settings; command-line options win."
        ),
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(envvar="DEPTHPRUNE_API_KEY", help="Require 'Authorization: Bearer KEY' on /v1/*."),
    ] = None,
    admin_token: Annotated[
        str | None,
        typer.Option(
            envvar="DEPTHPRUNE_ADMIN_TOKEN", help="Enable /admin/experiments behind this bearer token."
        ),
    ] = None,
    dtype: Annotated[
        str | None, typer.Option(help="vLLM --dtype of every process (auto, float32, bfloat16).")
    ] = None,
    max_model_len: Annotated[int | None, typer.Option(help="vLLM --max-model-len of every process.")] = None,
    kv_cache_gib: Annotated[
        int | None,
        typer.Option(help="CPU build: KV cache per process in GiB (VLLM_CPU_KVCACHE_SPACE) [default: 1]."),
    ] = None,
    gpu_memory_utilization: Annotated[
        float | None,
        typer.Option(help="GPU build: memory fraction per process [default: 0.9 / number of processes]."),
    ] = None,
    start_timeout: Annotated[
        float | None,
        typer.Option(help="Seconds to wait for each vLLM process to become healthy [default: 300]."),
    ] = None,
    first_port: Annotated[
        int | None, typer.Option(help="First port of the vLLM processes [default: free].")
    ] = None,
    vllm_arg: Annotated[
        list[str] | None,
        typer.Option(help="Extra argument for every vLLM process, repeatable: --vllm-arg=--enforce-eager."),
    ] = None,
    log_level: Annotated[str, typer.Option(help="Gateway log level (debug, info, warning).")] = "info",
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help="Print one JSON line {url, variants, experiments} once serving, instead of text."
        ),
    ] = False,
) -> None:
    """Serve variants through vLLM behind one OpenAI-compatible gateway with A/B routing and metrics.

    Each name is resolved in the registry (checkpoint checksum verified) and gets its own vLLM OpenAI
    server process, started one after another and waited for; then the gateway listens on HOST:PORT with
    /v1/completions, /v1/chat/completions, /v1/models, /metrics, /health and /ready. Ctrl-C stops all.
    """
    import logging

    import uvicorn

    from server.app import create_app
    from server.backends import BackendPool
    from server.settings import load_config_file

    file_config = load_config_file(config) if config is not None else {}
    options = dict(
        variants=variants,
        registry=registry,
        host=host,
        port=port,
        api_key=api_key,
        admin_token=admin_token,
        dtype=dtype,
        max_model_len=max_model_len,
        kv_cache_gib=kv_cache_gib,
        gpu_memory_utilization=gpu_memory_utilization,
        start_timeout_s=start_timeout,
        first_port=first_port,
        vllm_args=vllm_arg or [],
    )
    settings = build_settings(options, file_config)
    sock = listen_socket(settings.host, settings.port)
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    pool = BackendPool(settings)
    app = create_app(settings, pool)  # checks the experiments before any process starts

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        transient=True,
        disable=as_json,
    ) as progress:
        task = progress.add_task("starting backends", total=len(settings.backends))
        started: list[str] = []

        def on_start(name: str) -> None:
            if started:
                progress.advance(task)
            started.append(name)
            kind = "vLLM" if pool[name].managed else "remote"
            progress.update(task, description=f"starting {kind} backend {name!r}")

        try:
            asyncio.run(pool.start_backends(on_start))
        except KeyboardInterrupt:
            raise
        progress.advance(task)

    url = f"http://{settings.host}:{settings.port}"
    summary = {
        "url": url,
        "variants": {name: b.status() for name, b in pool.backends.items()},
        "experiments": list(settings.experiments),
    }
    if as_json:
        print(json.dumps(summary), flush=True)
    else:
        for name, backend in pool.backends.items():
            state = "up" if backend.up else f"DOWN ({backend.last_error})"
            print(f"  {name:<20} {backend.url:<28} {state}", file=sys.stderr)
        print(f"gateway listening on {url} (OpenAI API at {url}/v1)", file=sys.stderr, flush=True)
    config = uvicorn.Config(app, log_level=log_level.lower(), access_log=False, timeout_graceful_shutdown=10)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:
        pass  # uvicorn re-raises the Ctrl-C it already handled by shutting down cleanly
    finally:
        sock.close()
        pool.stop_processes()
