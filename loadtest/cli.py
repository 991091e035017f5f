"""``depthprune loadtest``: latency and throughput of each variant next to the dense model.

Example (gateway on port 8000 serving ``dense`` and ``ppl-best``)::

    depthprune loadtest --target http://127.0.0.1:8000 --models dense,ppl-best --rounds 3 \\
        --num-prompts 64 --output-len 64 --report-dir reports/ --save-result result.json
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated
from urllib.parse import urlparse

import typer

from depthprune.errors import UserError


def parse_rate(text: str) -> float:
    """``"inf"`` or a positive number of requests per second."""
    try:
        rate = float(text)
    except ValueError:
        raise UserError(f"--rate must be a number of requests per second or 'inf', got {text!r}") from None
    if not rate > 0:
        raise UserError(f"--rate must be positive or inf, got {text!r}")
    return rate


def check_url(url: str, option: str) -> str:
    """``url`` without a trailing slash when it is ``http(s)://host[:port]``; UserError otherwise."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise UserError(f"{option} {url!r} is not an http(s)://host:port URL")
    return url.rstrip("/")


def parse_models(spec: str, target: str) -> dict[str, str]:
    """``"dense,ppl-best"`` or ``"dense@http://h:8001,v@http://h:8002"`` -> ``{model: base URL}``."""
    targets: dict[str, str] = {}
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        name, sep, url = item.partition("@")
        if name in targets:
            raise UserError(f"--models lists {name!r} twice")
        targets[name] = check_url(url, f"--models {name}@") if sep else target
    if not targets:
        raise UserError("--models names no model (e.g. --models dense,ppl-best)")
    return targets


def check_models_served(targets: dict[str, str], api_key: str | None) -> dict[str, dict]:
    """``model -> /v1/models entry``; UserError for an unreachable target or a model it does not serve."""
    from loadtest.client import served_models

    cards: dict[str, dict] = {}
    listings: dict[str, dict[str, dict]] = {}
    for model, target in targets.items():
        if target not in listings:
            listings[target] = served_models(target, api_key=api_key)
        listing = listings[target]
        by_alias = {alias: card for card in listing.values() for alias in card.get("aliases") or []}
        card = listing.get(model) or by_alias.get(model)
        if card is None:
            raise UserError(
                f"{target} does not serve {model!r}; it serves: {', '.join(sorted(listing)) or 'nothing'}"
            )
        cards[model] = card
    return cards


def choose_tokenizer(
    tokenizer_dir: Path | None, targets: dict[str, str], cards: dict[str, dict], registry, api_key: str | None
):
    """The best tokenizer for prompts (see ``loadtest.prompts``)."""
    from loadtest.prompts import HFTokenizer, ServerTokenizer, WordTokenizer

    if tokenizer_dir is not None:
        if not tokenizer_dir.is_dir():
            raise UserError(f"--tokenizer {tokenizer_dir} is not a directory")
        return HFTokenizer(tokenizer_dir)
    first = next(iter(targets))
    local_dirs = [cards[first].get("root")]
    if registry is not None:
        try:
            local_dirs.insert(0, registry.resolve(first).checkpoint_path)
        except (UserError, AttributeError):
            pass
    for directory in local_dirs:
        if directory and (Path(directory) / "config.json").is_file():
            try:
                return HFTokenizer(directory)
            except (OSError, ValueError):
                continue
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    return ServerTokenizer.probe(targets[first], first, headers) or WordTokenizer()


def open_registry_or_none(url: str | None, enabled: bool):
    """The registry (``--registry`` or the default), or None when disabled or not installed."""
    if not enabled:
        return None
    try:
        from registry import open_registry
    except ImportError:
        if url:
            raise UserError("--registry was given but the registry package is not installed") from None
        return None
    return open_registry(url)


def store_in_registry(registry, result: dict) -> dict[str, str]:
    """Add each model's metrics as a serving benchmark; ``model -> "stored" | reason not stored``."""
    outcome: dict[str, str] = {}
    settings = {
        **result["settings"],
        "target": result["target"],
        "baseline": result["baseline"],
        "tokenizer": result["tokenizer"],
        "models": list(result["models"]),
    }
    for model, metrics in result["models"].items():
        try:
            registry.resolve(model)
        except UserError:
            outcome[model] = "not in the registry"
            continue
        stored = {key: value for key, value in metrics.items() if key != "rounds"}
        stored.update(result["comparison"].get(model, {}))
        registry.add_serving_benchmark(model, settings=settings, metrics=stored, hardware=result["hardware"])
        outcome[model] = "stored"
    return outcome


def loadtest(
    target: Annotated[
        str, typer.Option(help="Base URL of the gateway or vLLM server that serves the models.")
    ] = "http://127.0.0.1:8000",
    models: Annotated[
        str,
        typer.Option(
            help="Comma-separated models, baseline (dense) first; NAME@URL sends "
            "that model's load to another server."
        ),
    ] = "dense",
    rate: Annotated[
        str, typer.Option(help="Requests per second, or 'inf' to send all at once (saturation).")
    ] = "inf",
    burstiness: Annotated[
        float, typer.Option(help="Gamma shape of arrival gaps: 1 = Poisson, <1 burstier.")
    ] = 1.0,
    max_concurrency: Annotated[
        int | None, typer.Option(help="Most requests in flight (default: no cap).")
    ] = None,
    num_prompts: Annotated[int, typer.Option(help="Measured requests per model and round.")] = 64,
    input_len: Annotated[
        int, typer.Option(help="Prompt tokens (exact for synthetic prompts, a cut for texts).")
    ] = 128,
    output_len: Annotated[
        int, typer.Option(help="Tokens each request generates (ignore_eos keeps it exact).")
    ] = 64,
    warmup: Annotated[int, typer.Option(help="Unmeasured warm-up requests per model.")] = 2,
    seed: Annotated[int, typer.Option(help="Seed of prompts and arrival times.")] = 0,
    prompts: Annotated[
        str,
        typer.Option(
            help="'demo' (demo model test text), 'synthetic', or a file "
            "(JSON Lines with prompt/text, or one prompt per line)."
        ),
    ] = "synthetic",
    rounds: Annotated[
        int, typer.Option(help="Interleaved rounds; ratios are per round, so drift cancels.")
    ] = 1,
    goodput: Annotated[
        list[str] | None, typer.Option(help="SLOs for goodput in ms, e.g. 'ttft:500 tpot:50'.")
    ] = None,
    percentiles: Annotated[str, typer.Option(help="Comma-separated latency percentiles.")] = "90,99",
    sweep: Annotated[
        bool,
        typer.Option(
            "--sweep",
            help="Step the rate up (x2) until throughput stops growing "
            "or requests fail; the last step is reported.",
        ),
    ] = False,
    sweep_start: Annotated[
        float | None, typer.Option(help="First sweep rate (default: one stream's rate).")
    ] = None,
    sweep_steps: Annotated[int, typer.Option(help="Most rates a sweep tries.")] = 8,
    blocks: Annotated[
        list[str] | None,
        typer.Option(help="NAME=N:M: N blocks of the base, M removed (overrides registry and /v1/models)."),
    ] = None,
    tokenizer: Annotated[
        Path | None, typer.Option(help="Model directory whose tokenizer sizes prompts.")
    ] = None,
    ignore_eos: Annotated[bool, typer.Option(help="Generate exactly --output-len tokens.")] = True,
    request_timeout: Annotated[float, typer.Option(help="Seconds before one request fails.")] = 300.0,
    max_run_time: Annotated[
        float, typer.Option(help="Seconds one model's run may take in one round.")
    ] = 1800.0,
    api_key: Annotated[
        str | None, typer.Option(envvar="DEPTHPRUNE_API_KEY", help="Bearer token of the target.")
    ] = None,
    registry: Annotated[
        str | None,
        typer.Option(
            help="Registry URL (default: DEPTHPRUNE_REGISTRY_URL or the SQLite file in DEPTHPRUNE_HOME)."
        ),
    ] = None,
    save_registry: Annotated[
        bool, typer.Option(help="Store results as serving benchmarks of registry variants.")
    ] = True,
    save_result: Annotated[Path | None, typer.Option(help="Write the result JSON here.")] = None,
    report_dir: Annotated[
        Path | None, typer.Option(help="Write loadtest.md and PNG plots into this directory.")
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Measure latency and throughput of each model (dense first) under identical streaming load.

    Sends OpenAI completion requests with ignore_eos so every model generates the same tokens, times every
    streamed token, and reports TTFT, TPOT, ITL and E2E latency (mean, median, std, percentiles), request and
    token throughput and goodput with the key names of `vllm bench serve`; then each variant's ratio to the
    dense model next to the ideal N/(N-M) speedup of removing M of N blocks.
    """
    from loadtest.benchmark import Benchmark, SweepConfig, build_result, run
    from loadtest.blocks import block_counts
    from loadtest.compare import parse_blocks_overrides
    from loadtest.config import LoadConfig
    from loadtest.metrics import parse_goodput
    from loadtest.prompts import build_prompts

    target = check_url(target, "--target")
    try:
        slos = parse_goodput(goodput or [])
        percentile_values = tuple(float(p) for p in percentiles.split(",") if p.strip())
    except ValueError as error:
        raise UserError(str(error)) from None
    config = LoadConfig(
        rate=parse_rate(rate),
        burstiness=burstiness,
        max_concurrency=max_concurrency,
        num_prompts=num_prompts,
        input_len=input_len,
        output_len=output_len,
        warmup=warmup,
        seed=seed,
        rounds=rounds,
        prompts=prompts,
        ignore_eos=ignore_eos,
        goodput_slos_ms=slos,
        percentiles=percentile_values,
        request_timeout_s=request_timeout,
        max_run_s=max_run_time,
    )
    sweep_config = SweepConfig(start_rate=sweep_start, max_steps=sweep_steps) if sweep else None
    targets = parse_models(models, target)
    overrides = parse_blocks_overrides(blocks or [])
    baseline = next(iter(targets))
    if prompts not in ("demo", "synthetic") and not Path(prompts).is_file():
        raise UserError(f"--prompts {prompts!r} is neither 'demo', 'synthetic' nor an existing file")
    for path, option in ((save_result, "--save-result"), (report_dir, "--report-dir")):
        if path is not None and path.exists() and (path.is_dir() != (option == "--report-dir")):
            raise UserError(
                f"{option} {path} exists and is not a {'directory' if option == '--report-dir' else 'file'}"
            )

    cards = check_models_served(targets, api_key)
    registry_handle = open_registry_or_none(registry, save_registry or registry is not None)
    counts = block_counts(list(targets), cards, overrides, registry_handle if registry else None)
    chosen_tokenizer = choose_tokenizer(tokenizer, targets, cards, registry_handle, api_key)

    all_prompts = build_prompts(
        prompts,
        config.warmup + config.rounds * config.num_prompts,
        config.input_len,
        chosen_tokenizer,
        seed=config.seed,
    )
    warmup_prompts = all_prompts[: config.warmup]
    per_round = [
        all_prompts[config.warmup + r * config.num_prompts : config.warmup + (r + 1) * config.num_prompts]
        for r in range(config.rounds)
    ]

    from tqdm import tqdm

    benchmark = Benchmark(
        targets,
        config,
        api_key=api_key,
        progress=lambda description, total: tqdm(total=total, desc=description, unit="req", leave=False),
    )
    warm = run(benchmark.warm_up(warmup_prompts)) if warmup_prompts else {}
    for model, results in warm.items():
        failures = [result for result in results if not result.success]
        if failures and len(failures) == len(results):
            raise UserError(
                f"every warm-up request to {model!r} failed: {failures[0].error_kind}: {failures[0].error}"
            )

    steps, stop_reason = [], None
    if sweep_config is not None:
        first_rate = sweep_config.start_rate or _single_stream_rate(warm.get(baseline, []), config)
        steps, stop_reason = run(benchmark.sweep(per_round, sweep_config, baseline, first_rate))
        clean = [step for step in steps if not step.failed()]
        measurement = clean[-1] if clean else steps[-1]
    else:
        measurement = run(benchmark.measure(per_round))

    result = build_result(
        target=target,
        targets=targets,
        config=config,
        baseline=baseline,
        counts=counts,
        measurement=measurement,
        tokenizer=chosen_tokenizer.description,
        sweep_steps=steps,
        sweep_stop_reason=stop_reason,
    )
    if registry_handle is not None and save_registry:
        result["registry"] = store_in_registry(registry_handle, result)
    if save_result is not None:
        save_result.parent.mkdir(parents=True, exist_ok=True)
        save_result.write_text(json.dumps(result, indent=2))
    if report_dir is not None:
        from loadtest.report import write_report

        result["report_files"] = [str(path) for path in write_report(result, report_dir)]
    if json_output:
        typer.echo(json.dumps(result, indent=2))
    else:
        from loadtest.report import markdown_report

        typer.echo(markdown_report(result))


def _single_stream_rate(warmup_results, config) -> float:
    """Requests per second of one stream, from the warm-up latencies (or 1 req/s without them)."""
    latencies = [result.latency for result in warmup_results if result.success and result.latency > 0]
    if not latencies:
        return 1.0
    return 1.0 / (sum(latencies) / len(latencies))
