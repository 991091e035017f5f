"""Gateway tests against fake vLLM backends on loopback: routing, A/B stickiness and weights, auth,
errors and metrics, through real HTTP and the official ``openai`` client.

Run: ``.venv/bin/python -m pytest tests/test_server.py -q``
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from scipy.stats import chisquare

from depthprune.testing.fake_vllm import MAX_MODEL_LEN, create_fake_app, serve_in_thread
from depthprune.testing.imports import heavy_modules_loaded
from depthprune.testing.servers import free_port
from server import (
    BackendSpec,
    ExperimentSpec,
    GatewaySettings,
    Router,
    RoutingError,
    VariantMetadata,
    create_app,
    unit_hash,
)

API_KEY = "test-key"
ADMIN_TOKEN = "admin-secret"
EXPERIMENT = {
    "arms": [
        {"objective": "ppl", "weight": 2, "fallback": "dense"},
        {"objective": "margin", "weight": 1},
        {"name": "control", "variant": "dense", "weight": 1},
    ]
}


def variant_metadata() -> dict[str, VariantMetadata]:
    return {
        "dense": VariantMetadata(base_model="tiny-llama", num_blocks=6, is_dense=True),
        "ppl-v": VariantMetadata(
            base_model="tiny-llama",
            num_blocks=6,
            removed_blocks=[2, 3],
            objective="perplexity",
            aliases=["ppl-best"],
            calibration_loss=3.2,
            variant_id=1,
            search="greedy",
        ),
        "margin-v": VariantMetadata(
            base_model="tiny-llama",
            num_blocks=6,
            removed_blocks=[1, 4],
            objective="task_margin",
            aliases=["margin-best"],
            variant_id=2,
            search="beam",
        ),
    }


# -- routing (no HTTP) --------------------------------------------------------------------------------
def test_objective_arms_resolve_to_best_variant():
    metadata = variant_metadata()
    metadata["ppl-other"] = VariantMetadata(
        objective="perplexity", calibration_loss=1.0
    )  # lower loss, but not "best"
    router = Router(metadata)
    assert router.best_for_objective("ppl") == "ppl-v"  # the ppl-best alias wins over a lower loss
    del metadata["ppl-v"]
    assert Router(metadata).best_for_objective("ppl") == "ppl-other"
    with pytest.raises(ValueError, match="no served variant has calibration objective 'kl'"):
        router.best_for_objective("kl")


def test_sticky_assignment_is_deterministic_and_weight_proportional():
    router = Router(variant_metadata(), seed=0)
    router.set_experiment("llama-ab", ExperimentSpec.model_validate(EXPERIMENT))
    keys = [f"user-{i}" for i in range(12000)]
    arms = [router.route("llama-ab", key).arm for key in keys]
    # Sticky: a new router (another gateway replica, or after a restart) gives every key the same arm.
    other = Router(variant_metadata(), seed=123)
    other.set_experiment("llama-ab", ExperimentSpec.model_validate(EXPERIMENT))
    assert arms[:500] == [other.route("llama-ab", key).arm for key in keys[:500]]
    counts = Counter(arms)
    observed = [counts["ppl"], counts["margin"], counts["control"]]
    expected = [len(keys) * share for share in (0.5, 0.25, 0.25)]
    assert chisquare(observed, expected).pvalue > 1e-3, observed
    # Without a user key the split is random but still weighted.
    random_counts = Counter(router.route("llama-ab").arm for _ in range(4000))
    assert (
        chisquare(
            [random_counts[a] for a in ("ppl", "margin", "control")], [4000 * s for s in (0.5, 0.25, 0.25)]
        ).pvalue
        > 1e-3
    )


def test_zero_weight_arm_is_never_chosen_and_forced_only_when_forcible():
    router = Router(variant_metadata())
    arms = [{"variant": "dense", "weight": 0}, {"variant": "ppl-best", "weight": 1}]
    router.set_experiment("exp", ExperimentSpec.model_validate({"arms": arms, "forcible": ["dense"]}))
    assert {router.route("exp", f"u{i}").backend for i in range(300)} == {"ppl-v"}
    assert router.route("exp", "u1", forced_arm="dense").backend == "dense"
    with pytest.raises(RoutingError) as error:
        router.route("exp", forced_arm="nope")
    assert error.value.status == 400
    router.set_experiment("dark", ExperimentSpec.model_validate({"arms": arms}))
    with pytest.raises(RoutingError) as error:
        router.route("dark", "u1", forced_arm="dense")
    assert error.value.status == 400


def test_weight_change_moves_only_the_users_it_must():
    router = Router(variant_metadata())
    router.set_experiment(
        "exp",
        ExperimentSpec.model_validate(
            {"arms": [{"variant": "dense", "weight": 50}, {"variant": "ppl-v", "weight": 50}]}
        ),
    )
    before = {f"u{i}": router.route("exp", f"u{i}").arm for i in range(2000)}
    router.set_experiment(
        "exp",
        ExperimentSpec.model_validate(
            {"arms": [{"variant": "dense", "weight": 40}, {"variant": "ppl-v", "weight": 60}]}
        ),
    )
    after = {key: router.route("exp", key).arm for key in before}
    moved = [key for key in before if before[key] != after[key]]
    assert all(before[key] == "dense" and after[key] == "ppl-v" for key in moved)
    assert 0.05 < len(moved) / len(before) < 0.15  # about the 10 % that had to move
    assert 0 <= unit_hash("exp", "u1") < 1


def test_bad_experiment_specs_are_rejected():
    router = Router(variant_metadata())
    for bad in (
        {"arms": []},
        {"arms": [{"variant": "dense", "objective": "ppl"}]},
        {"arms": [{"variant": "dense", "weight": 0}]},
        {"arms": [{"variant": "dense"}], "extra": 1},
    ):
        with pytest.raises(ValueError):
            ExperimentSpec.model_validate(bad)
    with pytest.raises(ValueError, match="not served"):
        router.set_experiment("e", ExperimentSpec.model_validate({"arms": [{"variant": "missing"}]}))
    with pytest.raises(ValueError, match="already a served variant"):
        router.set_experiment("dense", ExperimentSpec.model_validate({"arms": [{"variant": "ppl-v"}]}))
    with pytest.raises(ValueError, match="fallback 'ghost'"):
        router.set_experiment(
            "e", ExperimentSpec.model_validate({"arms": [{"variant": "dense", "fallback": "ghost"}]})
        )


# -- the gateway over real HTTP -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fake_backends():
    servers = {name: serve_in_thread(create_fake_app(name), free_port()) for name in variant_metadata()}
    yield servers
    for server in servers.values():
        server.stop()


@pytest.fixture(scope="module")
def gateway(fake_backends):
    metadata = variant_metadata()
    specs = [BackendSpec(name, url=fake_backends[name].url, metadata=metadata[name]) for name in metadata]
    settings = GatewaySettings(
        backends=specs,
        experiments={"llama-ab": EXPERIMENT},
        api_key=API_KEY,
        admin_token=ADMIN_TOKEN,
        max_body_bytes=4096,
    )
    server = serve_in_thread(create_app(settings, seed=0), free_port())
    yield server
    server.stop()


@pytest.fixture()
def client(gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=API_KEY, max_retries=0)


@pytest.fixture()
def http(gateway):
    with httpx.Client(base_url=gateway.url, headers={"authorization": f"Bearer {API_KEY}"}) as session:
        yield session


def test_models_lists_variants_with_pruning_facts_and_experiments(client):
    models = {model.id: model for model in client.models.list()}
    assert set(models) == {"dense", "ppl-v", "margin-v", "llama-ab"}
    ppl = models["ppl-v"].model_dump()
    assert ppl["removed_blocks"] == [2, 3] and ppl["objective"] == "perplexity"
    assert ppl["base_model"] == "tiny-llama"
    assert ppl["max_model_len"] == MAX_MODEL_LEN and ppl["status"] == "up" and ppl["aliases"] == ["ppl-best"]
    assert models["dense"].model_dump()["removed_blocks"] == []
    arms = {arm["name"]: arm for arm in models["llama-ab"].model_dump()["arms"]}
    assert (
        arms["ppl"]["variant"] == "ppl-v"
        and arms["ppl"]["share"] == 0.5
        and arms["ppl"]["fallback"] == "dense"
    )
    assert client.models.retrieve("margin-best").id == "margin-v"


def test_completion_by_alias_names_the_variant(client):
    raw = client.completions.with_raw_response.create(model="ppl-best", prompt="w5 w6", max_tokens=3)
    completion = raw.parse()
    assert raw.headers["x-depthprune-variant"] == "ppl-v"
    assert completion.choices[0].text == "ppl-v-t0 ppl-v-t1 ppl-v-t2"
    assert completion.usage.completion_tokens == 3


def test_chat_streaming_relays_tokens_and_hides_the_injected_usage(client):
    chunks = list(
        client.chat.completions.create(
            model="dense", messages=[{"role": "user", "content": "w7"}], max_tokens=5, stream=True
        )
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text.split() == [f"dense-t{i}" for i in range(5)]
    assert all(chunk.usage is None for chunk in chunks)  # the client did not ask for usage
    with_usage = list(
        client.completions.create(
            model="margin-v", prompt="w9", max_tokens=2, stream=True, stream_options={"include_usage": True}
        )
    )
    assert with_usage[-1].usage.completion_tokens == 2 and with_usage[-1].choices == []


def test_experiment_routes_sticky_per_user_and_reports_the_arm(client, gateway):
    router = Router(variant_metadata())
    router.set_experiment("llama-ab", ExperimentSpec.model_validate(EXPERIMENT))
    seen = set()
    for i in range(12):
        user = f"customer-{i}"
        expected = router.route("llama-ab", user)
        for _ in range(2):  # the same user twice: the same arm
            raw = client.completions.with_raw_response.create(
                model="llama-ab", prompt="w5", max_tokens=1, user=user
            )
            assert raw.headers["x-depthprune-experiment"] == "llama-ab"
            assert raw.headers["x-depthprune-arm"] == expected.arm
            assert raw.headers["x-depthprune-variant"] == expected.backend
            assert raw.parse().choices[0].text.startswith(expected.backend)
        seen.add(expected.arm)
    assert len(seen) >= 2
    # The header carries the key when the body has no `user`; another header forces an arm.
    by_header = httpx.post(
        f"{gateway.url}/v1/completions",
        json={"model": "llama-ab", "prompt": "w5"},
        headers={"authorization": f"Bearer {API_KEY}", "x-depthprune-user": "customer-3"},
    )
    assert by_header.headers["x-depthprune-arm"] == router.route("llama-ab", "customer-3").arm
    forced = client.chat.completions.with_raw_response.create(
        model="llama-ab",
        messages=[{"role": "user", "content": "w5"}],
        extra_headers={"x-depthprune-arm": "control"},
    )
    assert forced.headers["x-depthprune-variant"] == "dense"


def test_api_key_is_required_on_the_openai_api(gateway):
    for key in ("wrong", ""):
        bad = openai.OpenAI(
            base_url=f"{gateway.url}/v1",
            api_key=key or "x",
            max_retries=0,
            default_headers={} if key else {"authorization": ""},
        )
        with pytest.raises(openai.AuthenticationError) as error:
            bad.completions.create(model="dense", prompt="w5")
        assert error.value.body["code"] == "invalid_api_key"
    assert httpx.get(f"{gateway.url}/health").status_code == 200  # operations endpoints stay open


def test_admin_changes_experiments_at_runtime(gateway, http):
    url = f"{gateway.url}/admin/experiments"
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"authorization": f"Bearer {API_KEY}"}).status_code == 401
    admin = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    assert "llama-ab" in httpx.get(url, headers=admin).json()
    spec = {
        "arms": [{"objective": "ppl", "weight": 0}, {"objective": "margin", "weight": 1}],
        "control": "ppl",
    }
    put = httpx.put(f"{url}/canary", json=spec, headers=admin)
    assert put.status_code == 200 and put.json()["canary"]["arms"][1]["variant"] == "margin-v"
    variants = {
        http.post("/v1/completions", json={"model": "canary", "prompt": "w5", "user": f"u{i}"}).headers[
            "x-depthprune-variant"
        ]
        for i in range(20)
    }
    assert variants == {"margin-v"}
    bad = httpx.put(f"{url}/canary", json={"arms": [{"objective": "kl"}]}, headers=admin)
    assert bad.status_code == 400 and "objective 'kl'" in bad.json()["error"]["message"]
    assert httpx.put(f"{url}/canary", content=b"{", headers=admin).status_code == 400
    assert httpx.delete(f"{url}/canary", headers=admin).status_code == 200
    assert http.post("/v1/completions", json={"model": "canary", "prompt": "w5"}).status_code == 404
    assert httpx.delete(f"{url}/canary", headers=admin).status_code == 404


def test_admin_is_disabled_without_a_token():
    settings = GatewaySettings(backends=[BackendSpec("dense", url="http://127.0.0.1:9")])
    app = create_app(settings)

    async def call():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://gw") as session:
            return await session.get("/admin/experiments", headers={"authorization": "Bearer x"})

    response = asyncio.run(call())
    assert response.status_code == 403 and response.json()["error"]["code"] == "admin_disabled"


BAD_REQUESTS = [
    # (description, body bytes or JSON, path, status, code, param)
    ("malformed JSON", b'{"model": "dense", "prompt": ', "/v1/completions", 400, "invalid_json", None),
    ("not an object", b"[1, 2]", "/v1/completions", 400, "invalid_json", None),
    ("empty body", b"", "/v1/completions", 400, "invalid_json", None),
    ("unknown model", {"model": "gpt-9", "prompt": "w5"}, "/v1/completions", 404, "model_not_found", "model"),
    (
        "wrong type",
        {"model": "dense", "prompt": "w5", "max_tokens": "lots"},
        "/v1/completions",
        400,
        "invalid_value",
        "max_tokens",
    ),
    (
        "stream not a bool",
        {"model": "dense", "prompt": "w5", "stream": "yes"},
        "/v1/completions",
        400,
        "invalid_value",
        "stream",
    ),
    ("missing messages", {"model": "dense"}, "/v1/chat/completions", 400, "invalid_value", "messages"),
    (
        "bad role",
        {"model": "dense", "messages": [{"role": "robot", "content": "x"}]},
        "/v1/chat/completions",
        400,
        "invalid_value",
        "messages.0.role",
    ),
    (
        "negative temperature",
        {"model": "dense", "prompt": "w5", "temperature": -1},
        "/v1/completions",
        400,
        "invalid_value",
        "temperature",
    ),
    (
        "max_tokens beyond the context",
        {"model": "dense", "prompt": "w5", "max_tokens": 10_000},
        "/v1/completions",
        400,
        "context_length_exceeded",
        "max_tokens",
    ),
    (
        "chat max_completion_tokens beyond the context",
        {"model": "llama-ab", "messages": [{"role": "user", "content": "w5"}], "max_completion_tokens": 500},
        "/v1/chat/completions",
        400,
        "context_length_exceeded",
        "max_completion_tokens",
    ),
    (
        "oversize body",
        {"model": "dense", "prompt": "w5 " * 3000},
        "/v1/completions",
        413,
        "request_too_large",
        None,
    ),
    (
        "prompt plus max_tokens beyond the context (backend's 400)",
        {"model": "dense", "prompt": "w5 " * 100, "max_tokens": 100},
        "/v1/completions",
        400,
        400,
        None,
    ),
]


@pytest.mark.parametrize("case", BAD_REQUESTS, ids=[case[0] for case in BAD_REQUESTS])
def test_bad_input_gets_an_openai_style_4xx(http, case):
    _, body, path, status, code, param = case
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = http.post(path, content=content, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["code"] == code and error["param"] == param


def test_unknown_routes_and_methods_answer_in_openai_shape(http):
    for response, status in ((http.get("/v1/nothing"), 404), (http.get("/v1/completions"), 405)):
        assert response.status_code == status
        assert response.json()["error"]["type"] == "invalid_request_error"


def test_openai_client_raises_typed_errors(client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-9", prompt="w5")
    with pytest.raises(openai.BadRequestError, match="context length"):
        client.completions.create(model="dense", prompt="w5", max_tokens=100_000)


def metric_samples(text: str) -> list:
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def sample_value(samples, name: str, **labels) -> float:
    return sum(
        s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def test_metrics_count_requests_tokens_and_latency_per_variant_and_arm(gateway, http, client):
    before = metric_samples(httpx.get(f"{gateway.url}/metrics").text)
    for _ in range(3):
        client.completions.create(model="margin-v", prompt="w5 w6 w7", max_tokens=4)
    list(
        client.completions.create(
            model="llama-ab",
            prompt="w5",
            max_tokens=2,
            stream=True,
            extra_headers={"x-depthprune-arm": "margin"},
        )
    )
    http.post("/v1/completions", json={"model": "margin-v", "prompt": "w5", "max_tokens": 10_000})
    after = metric_samples(httpx.get(f"{gateway.url}/metrics").text)

    def delta(name, **labels):
        return sample_value(after, name, **labels) - sample_value(before, name, **labels)

    requests = "depthprune_gateway_requests_total"
    assert delta(requests, variant="margin-v", experiment="", status="200") == 3
    assert delta(requests, variant="margin-v", experiment="", status="400") == 1
    assert delta(requests, variant="margin-v", experiment="llama-ab", arm="margin", status="200") == 1
    assert delta("depthprune_gateway_prompt_tokens_total", variant="margin-v", experiment="") == 9
    assert delta("depthprune_gateway_generation_tokens_total", variant="margin-v", experiment="") == 12
    assert delta("depthprune_gateway_generation_tokens_total", variant="margin-v", arm="margin") == 2
    assert delta("depthprune_gateway_time_to_first_token_seconds_count", arm="margin") == 1
    assert delta("depthprune_gateway_e2e_request_latency_seconds_count", variant="margin-v") == 4
    assert sample_value(after, "depthprune_gateway_requests_in_flight", variant="margin-v") == 0
    assert sample_value(after, "depthprune_gateway_backend_up", variant="margin-v") == 1


def test_backend_metrics_are_reachable_through_the_gateway(gateway):
    response = httpx.get(f"{gateway.url}/metrics/backends/ppl-best")
    assert response.status_code == 200 and 'vllm:num_requests_running{model_name="ppl-v"}' in response.text
    assert httpx.get(f"{gateway.url}/metrics/backends/nope").status_code == 404


def test_health_and_readiness(gateway):
    assert httpx.get(f"{gateway.url}/health").json() == {"status": "ok"}
    ready = httpx.get(f"{gateway.url}/ready")
    assert ready.status_code == 200 and set(ready.json()["backends"]) == {"dense", "ppl-v", "margin-v"}


def test_importing_server_pulls_no_engine():
    assert heavy_modules_loaded("import server, server.cli") == []


def test_client_leaving_a_stream_releases_it(gateway):
    before = metric_samples(httpx.get(f"{gateway.url}/metrics").text)
    body = {"model": "dense", "prompt": "w5", "max_tokens": 60, "stream": True, "fake_delay": 0.05}
    with httpx.stream(
        "POST", f"{gateway.url}/v1/completions", json=body, headers={"authorization": f"Bearer {API_KEY}"}
    ) as response:
        assert response.status_code == 200
        next(response.iter_raw())  # one token, then hang up
    deadline = time.monotonic() + 10
    while True:
        after = metric_samples(httpx.get(f"{gateway.url}/metrics").text)
        left = sample_value(
            after, "depthprune_gateway_requests_total", variant="dense", status="499"
        ) - sample_value(before, "depthprune_gateway_requests_total", variant="dense", status="499")
        if left == 1 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert left == 1
    assert sample_value(after, "depthprune_gateway_requests_in_flight", variant="dense") == 0
