"""Screenshots of the experiment page (``/ui/``) over a run: the bands narrowing as shadow scores come in.

On a home where ``depthprune demo`` left its SmolLM2-135M variants, ``depthprune serve`` runs two vLLM CPU
engines (dense, and ``--variant``, by default ``ppl-best``: M = 8 of 30 blocks) behind a gateway whose
experiment ``smollm2`` has the arms ``dense`` (the control), ``dense-aa`` (dense again: the A/A arm) and the
variant, shadow rate 1, sampled every ``--interval-s`` seconds. ``--concurrency`` clients send streamed
sampled answers (temperature 1, ``--max-tokens``) to held-out prompts (the starts of pydoc's test-split
paragraphs, as ``benchmarks.bench_online_quality`` sends them), each forced to the arms in turn. Headless
Chromium (:mod:`depthprune.testing.browser`) logs in to the experiment's page and saves a screenshot at each
of ``--shots`` minutes; at the end a guardrail (``max_nll_delta``) is added through the admin API, and the
last screenshot shows it firing on the time axis and in the history::

    nice .venv/bin/python -m benchmarks.ui_screenshots --home /work/online-quality-home \\
        --variant smollm2-135m-perplexity-one-shot-m8-f3a44c --shots 2,5,9 --out docs/experiments-page

``--smoke`` runs the same against fake vLLM backends in threads (seconds, no model): what the tests run.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from benchmarks.bench_online_quality import SERVE_OPTIONS, ask, check_memory, pydoc_prompts
from depthprune.testing.browser import headless_chromium, log_in

ADMIN_TOKEN = "screenshots"
EXPERIMENT = "smollm2"
ARMS = ("dense", "dense-aa", "ppl-best")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, help="a finished `depthprune demo` home (DEPTHPRUNE_HOME)")
    parser.add_argument("--variant", default="ppl-best", help="the pruned arm's registry name or alias")
    parser.add_argument("--shots", default="2,5,9", help="minutes into the run of each screenshot")
    parser.add_argument("--out", type=Path, default=Path("docs/experiments-page"))
    parser.add_argument("--interval-s", type=float, default=5.0, help="the gateway's series_interval_s")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--guardrail", type=float, default=0.1, help="max_nll_delta added after the run")
    parser.add_argument("--smoke", action="store_true", help="fake backends, seconds instead of minutes")
    args = parser.parse_args(argv)
    args.temperature = 1.0
    args.minutes = [float(item) for item in args.shots.split(",")]
    if not args.smoke and args.home is None:
        parser.error("--home is required (or --smoke)")
    return args


def spec(variant: str) -> dict:
    arms = [{"name": "dense", "variant": "dense"}, {"name": "dense-aa", "variant": "dense"}]
    return {"arms": [*arms, {"name": "ppl-best", "variant": variant}], "control": "dense", "shadow_rate": 1.0}


@contextlib.contextmanager
def smoke_gateway(args) -> Iterator[str]:
    from depthprune.testing.gateways import fake_backends, gateway_replica

    with fake_backends("dense", "pruned") as urls:
        experiments = {EXPERIMENT: spec("pruned")}
        settings = {
            "admin_token": ADMIN_TOKEN,
            "series_interval_s": args.interval_s,
            "guardrail_interval_s": 0.5,
        }
        with gateway_replica(urls, None, experiments, **settings) as url:
            yield url


@contextlib.contextmanager
def demo_gateway(args) -> Iterator[str]:
    """``depthprune serve --variants dense,VARIANT`` from the demo's home, with the experiment."""
    from depthprune.testing.servers import running_gateway
    from registry import open_registry

    registry_url = f"sqlite:///{args.home.resolve() / 'registry.db'}"
    variant = open_registry(registry_url).resolve(args.variant).name
    check_memory(2, 1)
    folder = args.home / "ui-screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "gateway.json"
    config.write_text(
        json.dumps({"experiments": {EXPERIMENT: spec(variant)}, "series_interval_s": args.interval_s})
    )
    options = [
        *SERVE_OPTIONS,
        "--registry",
        registry_url,
        "--config",
        str(config),
        "--admin-token",
        ADMIN_TOKEN,
    ]
    options += ["--kv-cache-gib", "1", "--allow-unfit", "--start-timeout", "900", "--log-level", "warning"]
    env = {"DEPTHPRUNE_HOME": str(args.home)}
    with running_gateway(
        f"dense,{variant}", folder / "serve.log", *options, env=env, timeout_s=1800
    ) as gateway:
        yield gateway.url


def send_until(url: str, args, stop: threading.Event) -> int:
    """Streamed sampled answers to held-out prompts, the arms in turn, until ``stop``; how many were sent."""
    prompts = itertools.cycle(pydoc_prompts(40))
    arms, turn = list(ARMS), itertools.count()
    lock, sent = threading.Lock(), [0]

    def worker(client: httpx.Client) -> None:
        while not stop.is_set():
            with lock:
                arm, prompt, sent[0] = arms[next(turn) % len(arms)], next(prompts), sent[0] + 1
            _, _, status = ask(client, url, EXPERIMENT, arm, prompt, args, f"user-{sent[0]}")
            if status == 400 and arm in arms:  # stopped (weight 0): it takes no forced requests any more
                with lock:
                    arms.remove(arm)
            elif status != 200:
                print(f"a request to {arm} answered {status}", flush=True)
                time.sleep(1)

    with httpx.Client(timeout=120) as client, ThreadPoolExecutor(args.concurrency) as pool:
        for _ in range(args.concurrency):
            pool.submit(worker, client)
    return sent[0]


def screenshot(driver, url: str, path: Path) -> None:
    """Log in to the experiment's page (a fresh tab), let it draw, and save it."""
    driver.get(f"{url}/ui/")
    driver.execute_script("window.sessionStorage.clear()")
    log_in(driver, f"{url}/ui/experiments/{EXPERIMENT}", ADMIN_TOKEN)
    time.sleep(4)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1400, height + 16)  # the whole page, no empty band below it
    time.sleep(1)
    path.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(path))
    from PIL import Image  # matplotlib's dependency

    with Image.open(path) as shot:  # 128 colours: a third of the bytes, the same to the eye
        shot.convert("RGB").quantize(colors=128, dither=Image.Dither.NONE).save(path, optimize=True)
    print(f"saved {path}", flush=True)


def add_guardrail(url: str, limit: float) -> None:
    headers = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    current = httpx.get(f"{url}/admin/experiments/{EXPERIMENT}", headers=headers)
    body = {**current.json()["spec"], "guardrails": {"max_nll_delta": limit}}
    headers["if-match"] = current.headers["etag"]
    httpx.put(f"{url}/admin/experiments/{EXPERIMENT}", json=body, headers=headers).raise_for_status()


def guardrail_fired(url: str) -> bool:
    history = httpx.get(f"{url}/admin/experiments/{EXPERIMENT}/history", headers=_admin()).json()["changes"]
    return any(change["actor"] == "guardrail" for change in history)


def _admin() -> dict:
    return {"authorization": f"Bearer {ADMIN_TOKEN}"}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    unit_s = 1.0 if args.smoke else 60.0  # --smoke: the shots are seconds, not minutes
    gateway = smoke_gateway(args) if args.smoke else demo_gateway(args)
    with gateway as url, headless_chromium(width=1400, height=1900) as driver:
        stop = threading.Event()
        sender = threading.Thread(target=lambda: print(f"{send_until(url, args, stop)} requests", flush=True))
        started = time.monotonic()
        sender.start()
        try:
            for minute in args.minutes:
                time.sleep(max(0.0, started + minute * unit_s - time.monotonic()))
                screenshot(
                    driver, url, args.out / f"experiment-page-{minute:g}{'s' if args.smoke else 'min'}.png"
                )
            add_guardrail(url, args.guardrail)
            deadline = time.monotonic() + 20 * unit_s
            while not guardrail_fired(url) and time.monotonic() < deadline:
                time.sleep(1)
            time.sleep(2 * args.interval_s)  # a sample after the change
            screenshot(driver, url, args.out / "experiment-page-guardrail.png")
        finally:
            stop.set()
            sender.join()


if __name__ == "__main__":
    main()
