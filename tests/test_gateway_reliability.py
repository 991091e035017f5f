"""Reliability of the gateway against fake vLLM backends on loopback (issue 18, gateway side).

- A burst after an idle pause, and a request on a pooled connection the backend has just closed, are
  served (retried once on a fresh connection) and never mark the backend down; a failed request only
  triggers a ``/health`` check.
- Client input never causes a 500: JSON nested 50,000 deep, non-finite experiment weights (which also
  install nothing).
- Exposure: ``/ready`` details and (with ``metrics_auth``) the metrics need the API key; a zero-weight
  arm is forced only when the experiment lists it as ``forcible``.
- A stalled request body gets 408; vLLM's error types are mapped to OpenAI's; invalid streaming
  parameters and engine errors before the first token are 4xx JSON answers, counted as such.

Run: ``.venv/bin/python -m pytest tests/test_gateway_reliability.py -q -p no:cacheprovider``
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import threading
import time

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from depthprune.testing.fake_vllm import ThreadServer, create_fake_app, serve_in_thread
from depthprune.testing.servers import free_port, wait_until
from ground.core.errors import UserError
from server import BackendSpec, GatewaySettings, create_app

API_KEY = "test-key"
ADMIN_TOKEN = "admin-secret"
AUTH = {"authorization": f"Bearer {API_KEY}"}
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}
COMPLETION = {"model": "dense", "prompt": "w5", "max_tokens": 2}


@contextlib.contextmanager
def gateway_over(*backends: tuple[str, str], **settings):
    """A gateway in a thread in front of ``(name, url)`` backends; yields ``(server, app)``."""
    specs = [BackendSpec(name, url=url) for name, url in backends]
    app = create_app(GatewaySettings(backends=specs, **settings))
    server = serve_in_thread(app, free_port())
    try:
        yield server, app
    finally:
        server.stop()


@contextlib.contextmanager
def fake_backend(name: str = "dense", keep_alive_s: float | None = None):
    """The fake vLLM app served by uvicorn in a thread, with its own idle keep-alive when given."""
    server = ThreadServer(create_fake_app(name), free_port())
    if keep_alive_s is not None:
        server.server.config.timeout_keep_alive = keep_alive_s
    server.start()
    try:
        yield server
    finally:
        server.stop()


def marked_down(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "is down" in r.getMessage()]


def metric(gateway, line_start: str, headers: dict | None = None) -> float:
    text = httpx.get(f"{gateway.url}/metrics", headers=headers).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start))


# -- 1. burst after idle: stale pooled connections ------------------------------------------------------
async def _burst(client: httpx.AsyncClient, size: int, spread_s: float = 0.0) -> list[int]:
    """``size`` concurrent completions; with ``spread_s``, streamed ones whose ends spread over that time
    (the fake backend waits ``fake_delay`` per event), so that the backend's keep-alive closes their
    connections one after another instead of all at once."""

    async def one(index: int) -> int:
        body = dict(COMPLETION, stream=True, fake_delay=index * spread_s / size) if spread_s else COMPLETION
        return (await client.post("/v1/completions", json=body)).status_code

    return await asyncio.gather(*(one(index) for index in range(size)))


def test_burst_after_idle_is_served_without_marking_the_backend_down(caplog):
    """48 concurrent requests, a pause until the backend's keep-alive (1 s) closes their connections, then
    48 more, sent while the backend is closing them: some go out on a connection the backend is closing.
    Before the fix the first such request marked the backend down and most of the burst got 503."""
    caplog.set_level(logging.INFO, logger="depthprune.server")
    with fake_backend(keep_alive_s=1) as backend, gateway_over(("dense", backend.url)) as (gateway, _):

        async def bursts() -> list[int]:
            statuses = []
            # the client drops an idle connection after 1 s, well before the gateway's own keep-alive (5 s)
            # closes it: the stale connections under test are the gateway's to the backend, not ours to it
            limits = httpx.Limits(max_connections=200, max_keepalive_connections=200, keepalive_expiry=1.0)
            async with httpx.AsyncClient(base_url=gateway.url, timeout=30, limits=limits) as client:
                for _ in range(3):
                    started = time.monotonic()
                    statuses += await _burst(client, 48, spread_s=0.2)
                    await asyncio.sleep(max(0.0, started + 1.1 - time.monotonic()))
                    statuses += await _burst(client, 48)
            return statuses

        statuses = asyncio.run(bursts())
        assert statuses.count(200) == len(statuses), {s: statuses.count(s) for s in set(statuses)}
        assert marked_down(caplog) == []
        assert httpx.get(f"{gateway.url}/ready").status_code == 200


class ConnectionDroppingBackend:
    """An upstream speaking just enough HTTP/1.1 to stand for vLLM, which drops the connection instead of
    answering a POST: on a kept-alive connection only (``reused``: as a server does whose keep-alive ran
    out just as the request arrived), or always (``every``: the request itself kills the connection).
    ``GET /health`` and ``GET /v1/models`` are always answered."""

    def __init__(self, drop: str):
        self.drop, self.served, self.dropped = drop, 0, 0
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ConnectionDroppingBackend:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", self.port))
        self._ready.set()
        self._loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        requests_on_connection = 0
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode()
                length = next(
                    (
                        int(line.split(":")[1])
                        for line in head.split("\r\n")
                        if line.lower().startswith("content-length")
                    ),
                    0,
                )
                await reader.readexactly(length)
                method, path = head.split(" ")[:2]
                if method == "POST" and (self.drop == "every" or requests_on_connection > 0):
                    self.dropped += 1
                    writer.transport.abort()  # a reset, before any byte of an answer
                    return
                requests_on_connection += 1
                writer.write(self._answer(method, path))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    def _answer(self, method: str, path: str) -> bytes:
        if path == "/v1/models":
            body = json.dumps({"object": "list", "data": [{"id": "dense", "max_model_len": 128}]})
        elif method == "POST":
            self.served += 1
            body = json.dumps(
                {"object": "text_completion", "model": "dense", "choices": [{"index": 0, "text": "ok"}]}
            )
        else:
            body = ""
        return (
            f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n{body}"
        ).encode()


def test_request_dropped_on_a_kept_alive_connection_is_retried_on_a_fresh_one(caplog):
    caplog.set_level(logging.INFO, logger="depthprune.server")
    with ConnectionDroppingBackend("reused") as backend, gateway_over(("dense", backend.url)) as (gateway, _):
        # Every other request goes out on the connection the one before left open, and is dropped.
        for _ in range(4):
            response = httpx.post(f"{gateway.url}/v1/completions", json=COMPLETION)
            assert response.status_code == 200, response.text
        assert backend.served == 4 and backend.dropped == 2
        assert metric(gateway, 'depthprune_gateway_upstream_retries_total{variant="dense"}') == 2
        assert marked_down(caplog) == []


def test_failed_request_is_not_retried_and_only_a_failed_health_check_marks_down(caplog):
    caplog.set_level(logging.INFO, logger="depthprune.server")
    with ConnectionDroppingBackend("every") as backend, gateway_over(("dense", backend.url)) as (gateway, _):
        response = httpx.post(f"{gateway.url}/v1/completions", json=COMPLETION)
        assert response.status_code == 503 and response.json()["error"]["code"] == "backend_unavailable"
        assert backend.dropped == 1  # sent on a fresh connection: it may have run, so it is not sent twice
        time.sleep(0.5)  # the health check the failure triggered has answered: /health is fine
        assert marked_down(caplog) == []
        assert httpx.get(f"{gateway.url}/ready").status_code == 200


def test_upstream_keepalive_must_be_positive():
    with pytest.raises(UserError, match="upstream_keepalive_s"):
        GatewaySettings(backends=[BackendSpec("dense", url="http://127.0.0.1:9")], upstream_keepalive_s=0)


# -- 2. client- and admin-triggered 500s ------------------------------------------------------------------
@pytest.fixture(scope="module")
def backends():
    with fake_backend("dense") as dense, fake_backend("ppl-v") as ppl:
        yield {"dense": dense.url, "ppl-v": ppl.url}


@pytest.fixture(scope="module")
def guarded(backends):
    """A gateway with an API key, admin token, metrics behind the key, and an experiment with a dark arm."""
    experiment = {
        "arms": [
            {"variant": "dense", "weight": 1},
            {"name": "dark", "variant": "ppl-v", "weight": 0},
            {"name": "canary", "variant": "ppl-v", "weight": 0},
        ],
        "forcible": ["canary"],
    }
    with gateway_over(
        *backends.items(),
        api_key=API_KEY,
        admin_token=ADMIN_TOKEN,
        metrics_auth=True,
        experiments={"exp": experiment},
        body_timeout_s=0.5,
    ) as (gateway, _):
        yield gateway


def nested(depth: int, opening: str = "[", closing: str = "]") -> str:
    return opening * depth + closing * depth


@pytest.mark.parametrize("kind", ["array", "object"])
def test_json_nested_50000_deep_is_a_400(guarded, kind):
    deep = nested(50_000) if kind == "array" else '{"a":' * 50_000 + "1" + "}" * 50_000
    body = '{"model": "dense", "prompt": "w5", "extra": ' + deep + "}"
    response = httpx.post(f"{guarded.url}/v1/completions", content=body, headers=AUTH, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_json"
    admin = httpx.put(f"{guarded.url}/admin/experiments/deep", content=deep, headers=ADMIN, timeout=30)
    assert admin.status_code == 400, admin.text


@pytest.mark.parametrize("weight", ["Infinity", "-Infinity", "NaN", "-1", "1e308, 1e308"])
def test_admin_refuses_bad_weights_and_installs_nothing(guarded, weight):
    url = f"{guarded.url}/admin/experiments"
    before = httpx.get(url, headers=ADMIN).json()
    if "," in weight:  # two finite weights whose sum is not finite
        first, second = weight.split(", ")
        arms = f'[{{"variant": "dense", "weight": {first}}}, {{"variant": "ppl-v", "weight": {second}}}]'
    else:
        arms = f'[{{"variant": "dense", "weight": {weight}}}, {{"variant": "ppl-v", "weight": 1}}]'
    response = httpx.put(f"{url}/bad", content=f'{{"arms": {arms}}}', headers=ADMIN)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_experiment"
    after = httpx.get(url, headers=ADMIN)
    assert after.status_code == 200 and after.json() == before and "bad" not in after.json()
    models = httpx.get(f"{guarded.url}/v1/models", headers=AUTH)
    assert models.status_code == 200 and "bad" not in {card["id"] for card in models.json()["data"]}


# -- 3. exposure ----------------------------------------------------------------------------------------
def test_ready_shows_details_only_with_the_api_key(guarded):
    anonymous = httpx.get(f"{guarded.url}/ready")
    assert anonymous.status_code == 200
    assert anonymous.json() == {
        "ready": True,
        "backends": {"dense": {"up": True}, "ppl-v": {"up": True}},
        "experiments": {"store": "memory", "in_sync": True},  # no versions, no registry errors
    }
    detailed = httpx.get(f"{guarded.url}/ready", headers=AUTH).json()["backends"]["dense"]
    assert detailed["up"] is True and detailed["url"].startswith("http://127.0.0.1:") and "pid" in detailed


def test_ready_shows_details_when_the_gateway_has_no_api_key(backends):
    with gateway_over(*backends.items()) as (gateway, _):
        assert "url" in httpx.get(f"{gateway.url}/ready").json()["backends"]["dense"]


def test_metrics_auth_requires_the_api_key(guarded):
    for path in ("/metrics", "/metrics/backends/dense"):
        assert httpx.get(f"{guarded.url}{path}").status_code == 401
        assert httpx.get(f"{guarded.url}{path}", headers={"authorization": "Bearer nope"}).status_code == 401
        assert httpx.get(f"{guarded.url}{path}", headers=AUTH).status_code == 200


def test_metrics_stay_open_by_default(backends):
    with gateway_over(*backends.items(), api_key=API_KEY) as (gateway, _):
        assert httpx.get(f"{gateway.url}/metrics").status_code == 200
        assert httpx.get(f"{gateway.url}/metrics/backends/dense").status_code == 200


def test_metrics_auth_needs_an_api_key():
    with pytest.raises(UserError, match="metrics_auth"):
        GatewaySettings(backends=[BackendSpec("dense", url="http://127.0.0.1:9")], metrics_auth=True)


def test_zero_weight_arm_is_forced_only_when_listed_as_forcible(guarded):
    def forced(arm: str) -> httpx.Response:
        body = {"model": "exp", "prompt": "w5", "max_tokens": 1}
        return httpx.post(
            f"{guarded.url}/v1/completions", json=body, headers={**AUTH, "x-depthprune-arm": arm}
        )

    dark = forced("dark")
    assert dark.status_code == 400 and dark.json()["error"]["code"] == "arm_not_forcible"
    assert forced("canary").headers["x-depthprune-variant"] == "ppl-v"
    assert forced("dense").headers["x-depthprune-variant"] == "dense"  # weight > 0: always forcible
    listing = httpx.get(f"{guarded.url}/admin/experiments", headers=ADMIN).json()["exp"]
    assert listing["forcible"] == ["canary"]
    unknown = {"arms": [{"variant": "dense"}], "forcible": ["ghost"]}
    response = httpx.put(f"{guarded.url}/admin/experiments/e2", json=unknown, headers=ADMIN)
    assert response.status_code == 400 and "ghost" in response.json()["error"]["message"]


# -- 4. smaller items ------------------------------------------------------------------------------------
def test_stalled_request_body_gets_408_and_the_connection_is_closed(guarded):
    port = int(guarded.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
        connection.sendall(
            b"POST /v1/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
            b"authorization: Bearer " + API_KEY.encode() + b'\r\ncontent-length: 100\r\n\r\n{"model": '
        )
        started = time.monotonic()
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert time.monotonic() - started < 4
    assert b'"code":"request_timeout"' in answer.replace(b" ", b"")


def vllm_errors_app() -> FastAPI:
    """An upstream answering as vLLM does on errors: its own error types, before or inside a stream."""
    app = FastAPI()
    errors = {
        "bad": (400, "BadRequestError"),
        "missing": (404, "NotFoundError"),
        "unprocessable": (422, "UnprocessableEntityError"),
        "phrase": (400, "Bad Request"),
    }

    @app.get("/health")
    async def health():
        return PlainTextResponse("")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "errors", "max_model_len": 128}]}

    @app.post("/v1/completions")
    async def completions(body: dict):
        status, kind = errors[body["prompt"]]
        error = {"error": {"message": f"{kind} here", "type": kind, "param": None, "code": status}}
        if not body.get("stream"):
            return JSONResponse(error, status)

        async def events():  # vLLM's engine validates on the first step of the stream: 200, then the error
            yield f"data: {json.dumps(error)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


@pytest.fixture(scope="module")
def errors_gateway():
    upstream = serve_in_thread(vllm_errors_app(), free_port())
    with gateway_over(("errors", upstream.url)) as (gateway, _):
        yield gateway
    upstream.stop()


@pytest.mark.parametrize(
    "prompt, status, expected_type",
    [
        ("bad", 400, "invalid_request_error"),
        ("missing", 404, "invalid_request_error"),
        ("unprocessable", 422, "invalid_request_error"),
        ("phrase", 400, "invalid_request_error"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_vllm_error_types_are_mapped_to_openai_types(errors_gateway, prompt, status, expected_type, stream):
    body = {"model": "errors", "prompt": prompt, "stream": stream}
    response = httpx.post(f"{errors_gateway.url}/v1/completions", json=body)
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert error["type"] == expected_type and error["message"].endswith("here")


def test_engine_error_before_the_first_token_is_counted_as_4xx(errors_gateway):
    line = (
        'depthprune_gateway_requests_total{arm="",endpoint="/v1/completions",experiment="",'
        'status="400",variant="errors"}'
    )
    before = metric(errors_gateway, line)
    body = {"model": "errors", "prompt": "bad", "stream": True}
    assert httpx.post(f"{errors_gateway.url}/v1/completions", json=body).status_code == 400
    assert metric(errors_gateway, line) == before + 1


INVALID_STREAMS = [
    ("stream_options without stream", {"stream_options": {"include_usage": True}}, "stream_options"),
    (
        "stream_options with stream false",
        {"stream": False, "stream_options": {"include_usage": True}},
        "stream_options",
    ),
    ("n zero", {"stream": True, "n": 0}, "n"),
    ("n too large", {"stream": True, "n": 1000}, "n"),
    ("negative max_tokens", {"stream": True, "max_tokens": -1}, "max_tokens"),
    ("best_of with stream", {"stream": True, "best_of": 2}, "best_of"),
    ("best_of below n", {"n": 3, "best_of": 2}, "best_of"),
    ("stream_options not an object", {"stream": True, "stream_options": [1]}, "stream_options"),
]


@pytest.mark.parametrize("case", INVALID_STREAMS, ids=[case[0] for case in INVALID_STREAMS])
def test_invalid_streaming_parameters_are_a_400_before_the_stream(guarded, case):
    _, fields, param = case
    line = (
        'depthprune_gateway_requests_total{arm="",endpoint="/v1/completions",experiment="",'
        'status="400",variant=""}'
    )
    before = metric(guarded, line, AUTH)
    response = httpx.post(f"{guarded.url}/v1/completions", json={**COMPLETION, **fields}, headers=AUTH)
    assert response.status_code == 400, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert response.json()["error"]["param"] == param
    assert metric(guarded, line, AUTH) == before + 1


def test_chat_stream_options_without_stream_is_a_400(guarded):
    body = {
        "model": "dense",
        "messages": [{"role": "user", "content": "w5"}],
        "stream_options": {"include_usage": True},
    }
    response = httpx.post(f"{guarded.url}/v1/chat/completions", json=body, headers=AUTH)
    assert response.status_code == 400 and response.json()["error"]["param"] == "stream_options"


def test_valid_stream_still_streams(guarded):
    body = {**COMPLETION, "stream": True, "n": 1, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{guarded.url}/v1/completions", json=body, headers=AUTH) as response:
        assert response.status_code == 200
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and '"usage"' in events[-2]


def test_dead_backend_is_marked_down_by_the_check_its_failure_triggers(backends):
    """The mark-down path still works between monitor rounds: a failed request checks /health at once."""
    with fake_backend("gone") as gone:
        settings = dict(health_interval_s=60)
        with gateway_over(("gone", gone.url), ("dense", backends["dense"]), **settings) as (gateway, _):
            body = {**COMPLETION, "model": "gone"}
            assert httpx.post(f"{gateway.url}/v1/completions", json=body).status_code == 200
            gone.stop()
            assert httpx.post(f"{gateway.url}/v1/completions", json=body).status_code == 503
            wait_until(lambda: httpx.get(f"{gateway.url}/ready").status_code == 503, 5, "gone marked down")
            assert httpx.post(f"{gateway.url}/v1/completions", json=COMPLETION).status_code == 200
