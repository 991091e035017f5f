"""Load test without a model server: metrics on recorded streams (replayed by a local aiohttp server) with
hand-computed answers, arrival statistics, ratio maths, reports, and bad command-line input. The
real-server run is test_loadtest_vllm.py."""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass, field

import aiohttp.test_utils
import numpy as np
import pytest
from aiohttp import web

from depthprune.testing.cli import run_cli
from depthprune.testing.servers import free_port
from ground.core.errors import UserError
from loadtest import (
    BlockCounts,
    LoadConfig,
    RequestResult,
    arrival_offsets,
    compute_metrics,
    geometric_mean,
    markdown_report,
    parse_goodput,
    ratios_to_baseline,
    speedup_summary,
    stream_completion,
    write_report,
)
from loadtest.blocks import block_counts, counts_from_card, counts_from_directory
from loadtest.compare import parse_blocks_overrides
from loadtest.metrics import max_concurrency_seen
from loadtest.runner import make_client

# --- metrics on fake streams with known answers ----------------------------------------------------------


def fake_results() -> list[RequestResult]:
    """Two completed requests and one failure; the expected numbers below are worked out by hand."""
    return [
        RequestResult(
            success=True,
            prompt_len=10,
            output_tokens=4,
            ttft=0.100,
            itl=[0.020, 0.030, 0.050],
            latency=0.200,
            start_time=0.0,
        ),
        RequestResult(
            success=True,
            prompt_len=6,
            output_tokens=2,
            ttft=0.200,
            itl=[0.040],
            latency=0.240,
            start_time=0.05,
        ),
        RequestResult(success=False, error_kind="http_503", error="backend down"),
    ]


def test_metrics_match_hand_computed_values():
    metrics = compute_metrics(fake_results(), duration_s=1.0)
    assert metrics["completed"] == 2 and metrics["failed"] == 1
    assert metrics["total_input_tokens"] == 16 and metrics["total_output_tokens"] == 6
    assert metrics["request_throughput"] == pytest.approx(2.0)
    assert metrics["output_throughput"] == pytest.approx(6.0)
    assert metrics["total_token_throughput"] == pytest.approx(22.0)
    # TTFT 100 and 200 ms.
    assert metrics["mean_ttft_ms"] == pytest.approx(150.0)
    assert metrics["median_ttft_ms"] == pytest.approx(150.0)
    assert metrics["std_ttft_ms"] == pytest.approx(50.0)
    assert metrics["p90_ttft_ms"] == pytest.approx(190.0)
    assert metrics["p99_ttft_ms"] == pytest.approx(199.0)
    # TPOT excludes the first token: (200-100)/3 = 33.33 ms and (240-200)/1 = 40 ms.
    assert metrics["mean_tpot_ms"] == pytest.approx((100 / 3 + 40) / 2)
    assert metrics["std_tpot_ms"] == pytest.approx((40 - 100 / 3) / 2)
    # ITL pools every gap: 20, 30, 50, 40 ms.
    assert metrics["mean_itl_ms"] == pytest.approx(35.0)
    assert metrics["median_itl_ms"] == pytest.approx(35.0)
    assert metrics["std_itl_ms"] == pytest.approx(math.sqrt(125.0))
    assert metrics["p90_itl_ms"] == pytest.approx(47.0)
    assert metrics["mean_e2el_ms"] == pytest.approx(220.0)
    assert metrics["p99_e2el_ms"] == pytest.approx(239.6)
    assert metrics["request_goodput"] is None
    assert metrics["errors"] == {"http_503": 1}
    assert metrics["max_concurrent_requests"] == 2


def test_goodput_counts_requests_meeting_every_slo():
    assert compute_metrics(fake_results(), 2.0, goodput_slos_ms={"ttft": 150})["request_goodput"] == 0.5
    both = compute_metrics(fake_results(), 1.0, goodput_slos_ms={"ttft": 250, "tpot": 35})
    assert both["request_goodput"] == 1.0  # the second request's TPOT of 40 ms misses
    assert compute_metrics(fake_results(), 1.0, goodput_slos_ms={"e2el": 300})["request_goodput"] == 2.0
    assert parse_goodput(["ttft:500 tpot:50"]) == {"ttft": 500.0, "tpot": 50.0}
    assert parse_goodput(["ttft:500", "e2el:2000"]) == {"ttft": 500.0, "e2el": 2000.0}
    for bad in (["itl:5"], ["ttft"], ["ttft:fast"], ["ttft:-1"]):
        with pytest.raises(ValueError):
            parse_goodput(bad)


def test_metrics_of_a_run_without_successes_are_zero_not_nan():
    metrics = compute_metrics([RequestResult(error_kind="timeout")], 1.0)
    assert metrics["completed"] == 0 and metrics["failed"] == 1
    assert metrics["mean_ttft_ms"] == 0.0 and metrics["output_throughput"] == 0.0
    assert metrics["errors"] == {"timeout": 1}


def test_touching_requests_do_not_count_as_concurrent():
    back_to_back = [
        RequestResult(success=True, start_time=0.0, latency=1.0),
        RequestResult(success=True, start_time=1.0, latency=1.0),
    ]
    assert max_concurrency_seen(back_to_back) == 1


# A stream recorded from the vLLM 0.32 OpenAI server (four tokens, then usage), replayed with delays.
RECORDED_STREAM = [
    'data: {"id":"cmpl-1","object":"text_completion","model":"tiny","choices":[{"index":0,"text":" w109",'
    '"finish_reason":null}]}',
    'data: {"id":"cmpl-1","object":"text_completion","model":"tiny","choices":[{"index":0,"text":" w97",'
    '"finish_reason":null}]}',
    ": ping",
    'data: {"id":"cmpl-1","object":"text_completion","model":"tiny","choices":[{"index":0,"text":" w147",'
    '"finish_reason":null}]}',
    'data: {"id":"cmpl-1","object":"text_completion","model":"tiny","choices":[{"index":0,"text":" w93",'
    '"finish_reason":"length"}]}',
    'data: {"id":"cmpl-1","object":"text_completion","model":"tiny","choices":[],'
    '"usage":{"prompt_tokens":2,"total_tokens":6,"completion_tokens":4}}',
    "data: [DONE]",
]


@dataclass
class Replay:
    """What the replaying server answers on ``POST /v1/completions``, and the requests it saw."""

    status: int = 200
    events: list[str] | None = None
    """SSE events sent one by one, each ``gap_s`` after the one before; None = a JSON ``body``."""
    body: dict | None = None
    gap_s: float = 0.05
    headers: dict[str, str] = field(default_factory=dict)
    cut_after: int | None = None
    """Drop the connection after this many events, mid-stream."""
    seen: list[dict] = field(default_factory=list)
    """``{"json": body, "authorization": header}`` of every request received."""

    async def completions(self, request: web.Request) -> web.StreamResponse:
        authorization = request.headers.get("authorization")
        self.seen.append({"json": await request.json(), "authorization": authorization})
        if self.events is None:
            return web.json_response(self.body, status=self.status, headers=self.headers)
        response = web.StreamResponse(status=self.status, headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for sent, event in enumerate(self.events):
            if sent == self.cut_after:
                request.transport.close()
                return response
            await asyncio.sleep(self.gap_s)
            await response.write((event + "\n\n").encode())
        await response.write_eof()
        return response


def run_stream(
    replay: Replay, max_tokens: int = 4, *, api_key: str | None = None, timeout_s: float = 300.0
) -> RequestResult:
    """Stream one completion from a real local aiohttp server replaying ``replay``, with the session
    ``make_client`` builds (so its headers and redirect policy are what the test sees)."""

    async def go():
        app = web.Application()
        app.router.add_post("/v1/completions", replay.completions)
        app.router.add_post("/moved/v1/completions", Replay(events=RECORDED_STREAM).completions)
        server = aiohttp.test_utils.TestServer(app, host="127.0.0.1")
        await server.start_server()
        try:
            async with make_client(LoadConfig(), api_key) as client:
                return await stream_completion(
                    client,
                    str(server.make_url("/")),
                    "tiny",
                    "w5 w6",
                    max_tokens,
                    prompt_len_estimate=99,
                    timeout_s=timeout_s,
                )
        finally:
            await server.close()

    return asyncio.run(go())


def test_recorded_stream_is_timed_token_by_token():
    replay = Replay(events=RECORDED_STREAM, gap_s=0.05)
    result = run_stream(replay)
    assert result.success, result.error
    sent = replay.seen[0]["json"]
    assert sent["ignore_eos"] is True and sent["min_tokens"] == 4 and sent["max_tokens"] == 4
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    assert replay.seen[0]["authorization"] is None  # no key, no header
    assert result.output_tokens == 4 and result.prompt_len == 2  # the server's usage wins over the estimate
    assert result.generated_text == " w109 w97 w147 w93"
    # First token after one gap; the ping is no token, so the third token comes two gaps after the second.
    assert result.ttft == pytest.approx(0.05, abs=0.04)
    assert len(result.itl) == 3
    assert result.itl[0] == pytest.approx(0.05, abs=0.04)
    assert result.itl[1] == pytest.approx(0.10, abs=0.04)
    assert result.latency == pytest.approx(result.ttft + sum(result.itl))
    # The last token was the fifth event of seven; the usage and [DONE] events after it do not count.
    assert result.latency == pytest.approx(0.25, abs=0.06)
    metrics = compute_metrics([result], duration_s=result.latency)
    assert metrics["mean_tpot_ms"] == pytest.approx(sum(result.itl) / 3 * 1000)


def test_stream_without_usage_counts_chunks_and_keeps_the_estimate():
    result = run_stream(Replay(events=RECORDED_STREAM[:2] + [RECORDED_STREAM[-1]], gap_s=0.001))
    assert result.success and result.output_tokens == 2 and result.prompt_len == 99


def test_api_key_is_sent_as_a_bearer_token():
    replay = Replay(events=RECORDED_STREAM, gap_s=0.001)
    assert run_stream(replay, api_key="secret").success
    assert replay.seen[0]["authorization"] == "Bearer secret"


def test_stream_errors_are_classified():
    error_body = {
        "error": {
            "message": "The model `nope` does not exist.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }
    result = run_stream(Replay(status=404, body=error_body))
    assert not result.success and result.error_kind == "http_404"
    assert result.error == "The model `nope` does not exist."
    assert run_stream(Replay(events=[RECORDED_STREAM[-1]], gap_s=0.001)).error_kind == "no_tokens"
    assert run_stream(Replay(events=["data: {not json"], gap_s=0.001)).error_kind == "protocol"
    assert run_stream(Replay(events=["data: [1, 2]"], gap_s=0.001)).error_kind == "protocol"
    in_stream = run_stream(
        Replay(events=[RECORDED_STREAM[0], 'data: {"error": {"message": "engine died"}}'], gap_s=0.001)
    )
    assert in_stream.error_kind == "stream_error" and in_stream.error == "engine died"
    # A redirect is reported, not followed (the target behind it would stream fine).
    moved = Replay(status=307, body={}, headers={"location": "/moved/v1/completions"})
    assert run_stream(moved).error_kind == "http_307"
    slow = run_stream(Replay(events=RECORDED_STREAM, gap_s=0.5), timeout_s=0.2)
    assert slow.error_kind == "timeout" and "0.2 s" in slow.error
    cut = run_stream(Replay(events=RECORDED_STREAM, gap_s=0.001, cut_after=2))
    assert cut.error_kind == "connection" and "Payload" in cut.error
    port = free_port()

    async def refused():
        async with make_client(LoadConfig()) as client:
            return await stream_completion(client, f"http://127.0.0.1:{port}", "tiny", "x", 2)

    assert asyncio.run(refused()).error_kind == "connection"


# --- arrivals --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_arrivals_have_the_mean_rate_and_the_cv_of_the_burstiness(burstiness):
    offsets = np.array(arrival_offsets(20000, rate=5.0, burstiness=burstiness, seed=1))
    gaps = np.diff(np.concatenate([[0.0], offsets]))
    assert offsets[-1] == pytest.approx(20000 / 5.0)  # rescaled to exactly n / rate, as vLLM does
    assert gaps.mean() == pytest.approx(0.2, rel=1e-9)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)
    assert np.all(gaps >= 0)


def test_poisson_arrivals_count_per_second_is_poisson():
    offsets = np.array(arrival_offsets(20000, rate=10.0, seed=3))
    counts = np.bincount(offsets.astype(int))[:-1]
    assert counts.mean() == pytest.approx(10.0, rel=0.02)
    assert counts.var() == pytest.approx(10.0, rel=0.15)  # Poisson: variance = mean


def test_arrival_edge_cases_and_seeds():
    assert arrival_offsets(5, math.inf) == [0.0] * 5
    assert arrival_offsets(4, 2.0, burstiness=math.inf) == pytest.approx([0.5, 1.0, 1.5, 2.0])
    assert arrival_offsets(50, 3.0, seed=7) == arrival_offsets(50, 3.0, seed=7)
    assert arrival_offsets(50, 3.0, seed=7) != arrival_offsets(50, 3.0, seed=8)
    for bad in (
        dict(num_requests=0, rate=1.0),
        dict(num_requests=3, rate=0.0),
        dict(num_requests=3, rate=1.0, burstiness=0.0),
    ):
        with pytest.raises(ValueError):
            arrival_offsets(**bad)


# --- comparison maths ------------------------------------------------------------------------------------


def test_per_round_ratios_cancel_drift():
    # The machine got 20 % slower in round 2; both models slowed alike, so the ratio must stay 1.25.
    per_round = {
        "dense": [
            {"output_throughput": 100.0, "mean_tpot_ms": 10.0},
            {"output_throughput": 80.0, "mean_tpot_ms": 12.5},
        ],
        "v": [
            {"output_throughput": 125.0, "mean_tpot_ms": 8.0},
            {"output_throughput": 100.0, "mean_tpot_ms": 10.0},
        ],
    }
    ratios = ratios_to_baseline(per_round, "dense", keys=("output_throughput", "mean_tpot_ms"))
    assert set(ratios) == {"v"}
    assert ratios["v"]["output_throughput"] == pytest.approx(1.25)
    assert ratios["v"]["mean_tpot_ms"] == pytest.approx(0.8)
    assert geometric_mean([1.2, 1.375]) == pytest.approx(math.sqrt(1.2 * 1.375))
    assert geometric_mean([]) is None


def test_speedup_against_ideal():
    counts = BlockCounts(16, 4)
    assert counts.ideal_speedup == pytest.approx(4 / 3)
    summary = speedup_summary(1.3, counts)
    assert summary["fraction_of_ideal_speedup"] == pytest.approx(1.3 / (4 / 3))
    assert summary["fraction_of_ideal_gain"] == pytest.approx(0.9)
    assert speedup_summary(1.0, BlockCounts(16, 0))["fraction_of_ideal_gain"] is None
    assert speedup_summary(1.1, None)["ideal_speedup"] is None
    with pytest.raises(UserError):
        BlockCounts(4, 4)


def test_block_counts_from_every_source(tmp_path):
    variant = tmp_path / "variant"
    variant.mkdir()
    (variant / "pruning.json").write_text(
        json.dumps({"base_num_blocks": 16, "removed_blocks": [3, 7, 9, 12]})
    )
    dense = tmp_path / "dense"
    dense.mkdir()
    (dense / "config.json").write_text(json.dumps({"num_hidden_layers": 16}))
    assert counts_from_directory(str(variant)) == BlockCounts(16, 4, source="pruning.json")
    assert counts_from_directory(str(dense)) == BlockCounts(16, 0, source="config.json")
    assert counts_from_directory(str(tmp_path / "missing")) is None
    assert counts_from_card({"num_blocks": 12, "removed_blocks": [1, 2, 3]}) == BlockCounts(
        12, 3, "/v1/models"
    )
    assert counts_from_card({"id": "plain-vllm"}) is None
    overrides = parse_blocks_overrides(["dense=16:0,v=16:4"])
    cards = {"dense": {"root": str(dense)}, "v": {"root": str(variant)}, "w": {}}
    counts = block_counts(["dense", "v", "w"], cards, {"v": overrides["v"]})
    assert (
        counts["dense"].source == "config.json" and counts["v"].source == "--blocks" and counts["w"] is None
    )
    for bad in (["v=16"], ["=16:4"], ["v=a:b"], ["v=4:4"]):
        with pytest.raises(UserError):
            parse_blocks_overrides(bad)
    with pytest.raises(UserError, match="not benchmarked"):
        block_counts(["dense"], cards, overrides)


def test_config_rejects_bad_load():
    for bad in (
        dict(num_prompts=0),
        dict(rate=0.0),
        dict(burstiness=-1.0),
        dict(max_concurrency=0),
        dict(rounds=0),
        dict(output_len=0),
        dict(percentiles=(100.0,)),
    ):
        with pytest.raises(UserError):
            LoadConfig(**bad)
    assert LoadConfig().as_dict()["rate"] == "inf"


# --- reports ---------------------------------------------------------------------------------------------


def test_report_files(tmp_path):
    config = LoadConfig(num_prompts=3, rounds=1)
    dense = compute_metrics(fake_results(), 1.0)
    variant = compute_metrics(fake_results(), 0.8)
    result = {
        "target": "http://127.0.0.1:8000",
        "hardware": "test",
        "tokenizer": "approximate",
        "baseline": "dense",
        "settings": config.as_dict(),
        "models": {
            "dense": {**dense, "blocks": {"num_blocks": 16, "removed_blocks": 0}},
            "v": {**variant, "blocks": {"num_blocks": 16, "removed_blocks": 4}},
        },
        "comparison": {
            "v": {
                **speedup_summary(1.25, BlockCounts(16, 4)),
                "ratios": ratios_to_baseline({"dense": [dense], "v": [variant]}, "dense")["v"],
                "output_throughput_speedup_ci95": [1.2, 1.3],
                "fraction_of_ideal_speedup_ci95": [0.9, 0.975],
            }
        },
        "sweep": [
            {"rate": 1.0, "offered_rate": 1.0, "models": {"dense": dense, "v": variant}},
            {"rate": 2.0, "offered_rate": 2.0, "models": {"dense": dense, "v": variant}},
        ],
        "sweep_stop_reason": "saturated",
    }
    table = markdown_report(result)
    assert "| v | 12/16 | 2.50 | 7.5 |" in table
    assert "| v | 1.333 | 1.25x [1.20, 1.30] | 0.94 [0.90, 0.97] | 0.750 |" in table
    paths = write_report(result, tmp_path / "report")
    assert sorted(path.name for path in paths) == [
        "latency_percentiles.png",
        "loadtest.md",
        "throughput.png",
        "throughput_vs_rate.png",
    ]
    for path in paths:
        assert path.stat().st_size > 100
    assert (tmp_path / "report" / "throughput.png").read_bytes()[:4] == b"\x89PNG"


# --- command line ----------------------------------------------------------------------------------------


def test_help():
    code, out, _ = run_cli("loadtest", "--help")
    assert code == 0 and "--max-concurrency" in out and "--sweep" in out and "--json" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--target", "http://127.0.0.1:{port}"], "cannot reach http://127.0.0.1:"),
        (["--target", "http://127.0.0.1:{port}", "--num-prompts", "0"], "--num-prompts must be at least 1"),
        (["--target", "ftp://x"], "not an http(s)://host:port URL"),
        (["--target", "http://127.0.0.1:{port}", "--rate", "fast"], "--rate must be a number"),
        (["--target", "http://127.0.0.1:{port}", "--goodput", "itl:3"], "goodput SLO"),
        (["--target", "http://127.0.0.1:{port}", "--prompts", "/nope.txt"], "neither synthetic, pydoc"),
        (["--target", "http://127.0.0.1:{port}", "--models", "a,a"], "twice"),
    ],
)
def test_bad_input_is_one_line(args, message):
    port = free_port()
    code, _, err = run_cli("loadtest", *[arg.format(port=port) for arg in args])
    assert code == 2
    assert err.startswith("error: ") and message in err and err.count("\n") == 1 and "Traceback" not in err


# --- prompts ----------------------------------------------------------------------------------------------


def test_prompts_are_fixed_by_the_seed_and_cut_to_input_len(tmp_path, monkeypatch):
    from loadtest.prompts import WordTokenizer, build_prompts

    tokenizer = WordTokenizer()
    synthetic = build_prompts("synthetic", 5, 12, tokenizer, seed=3)
    assert [p.estimated_len for p in synthetic] == [12] * 5
    assert all(len(p.text.split()) == 12 for p in synthetic)
    assert synthetic == build_prompts("synthetic", 5, 12, tokenizer, seed=3)
    assert synthetic != build_prompts("synthetic", 5, 12, tokenizer, seed=4)

    text_file = tmp_path / "prompts.txt"
    text_file.write_text("one two three\n\nfour five six seven eight\n")
    from_text = build_prompts(str(text_file), 4, 4, tokenizer, seed=0)
    assert sorted({p.text for p in from_text}) == ["four five six seven", "one two three"]
    assert len(from_text) == 4  # two texts reused to fill four requests

    # A home of its own: the session's home holds the real tiny demo model other tests build.
    monkeypatch.setenv("DEPTHPRUNE_HOME", str(tmp_path / "home"))
    demo = tmp_path / "home" / "models" / "demo-test" / "data"
    demo.mkdir(parents=True)
    (demo / "text_test.jsonl").write_text('{"text": "the river ran north"}\n{"text": "a city by the sea"}\n')
    assert {p.text for p in build_prompts("demo", 6, 50, tokenizer)} == {
        "the river ran north",
        "a city by the sea",
    }

    jsonl = tmp_path / "bad.jsonl"
    jsonl.write_text('{"prompt": 3}\n')
    with pytest.raises(UserError, match="no string 'prompt'"):
        build_prompts(str(jsonl), 1, 8, tokenizer)
    with pytest.raises(UserError, match="at least 1"):
        build_prompts("synthetic", 0, 8, tokenizer)
