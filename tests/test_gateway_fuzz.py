"""Property-based tests of the gateway's request handling: whatever a client sends, the answer is never 5xx.

- ``hypothesis`` on the request check alone (any bytes: a checked request or a 4xx), then over HTTP against a
  gateway in front of fake vLLM backends (no engine), with near-valid OpenAI requests of every shape;
- a bounded ``schemathesis`` run against the gateway's own OpenAPI schema (``/openapi.json``), in a process
  of its own (:mod:`depthprune.testing.schema_fuzz`).

Run: ``.venv/bin/python -m pytest tests/test_gateway_fuzz.py -q -p no:cacheprovider``
"""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from depthprune.testing.fake_vllm import create_fake_app, serve_in_thread
from depthprune.testing.servers import free_port
from server import BackendSpec, GatewaySettings, create_app
from server.errors import GatewayError
from server.protocol import ChatCompletionRequest, CompletionRequest
from server.proxy import parse_request

API_KEY = "fuzz-key"
ADMIN_TOKEN = "fuzz-admin"
VARIANTS = ("dense", "ppl-v")
EXPERIMENT = {"arms": [{"variant": "dense"}, {"name": "dark", "variant": "ppl-v", "weight": 0}]}
FUZZ = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)

# -- strategies --------------------------------------------------------------------------------------
numbers = st.integers(-(2**70), 2**70) | st.floats(allow_nan=True, allow_infinity=True)
scalars = st.none() | st.booleans() | numbers | st.text(max_size=12)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=10,
)
# Fields the gateway checks, with values of the right type and range as often as not.
FIELD_VALUES = {
    "stream": st.booleans() | json_values,
    "stream_options": st.none() | st.fixed_dictionaries({"include_usage": st.booleans()}) | json_values,
    "max_tokens": st.integers(-5, 300) | json_values,
    "max_completion_tokens": st.integers(-5, 300) | json_values,
    "n": st.integers(-1, 200) | json_values,
    "best_of": st.integers(-1, 200) | json_values,
    "temperature": st.floats(-1, 3) | json_values,
    "top_p": st.floats(-1, 2) | json_values,
    "seed": st.integers(-(2**70), 2**70) | json_values,
    "stop": st.text(max_size=5) | st.lists(st.text(max_size=5), max_size=3) | json_values,
    "user": st.text(max_size=10) | json_values,
    "logprobs": st.integers(-2, 30) | st.booleans() | json_values,
    "echo": st.booleans() | json_values,
    "presence_penalty": st.floats(-3, 3) | json_values,
}
models = st.sampled_from([*VARIANTS, "exp", "ppl-best", "nope"]) | st.text(max_size=10) | json_values
prompts = (
    st.text(max_size=30)
    | st.lists(st.text(max_size=8), max_size=3)
    | st.lists(st.integers(0, 50_000), max_size=8)
    | st.lists(st.lists(st.integers(0, 50_000), max_size=4), max_size=3)
    | json_values
)
roles = st.sampled_from(["system", "user", "assistant", "tool", "robot"])
messages = (
    st.lists(
        st.fixed_dictionaries({"role": roles, "content": st.text(max_size=20) | json_values}) | json_values,
        max_size=3,
    )
    | json_values
)
# Extra fields pass through to the backend; the fake one reads `fake_delay`, which is no client's business.
extras = st.dictionaries(st.text(max_size=8).filter(lambda key: key != "fake_delay"), json_values, max_size=3)


@st.composite
def openai_bodies(draw, chat: bool) -> dict:
    """A request body near a valid one: the required fields mostly there, other known fields at random."""
    body = draw(extras)
    if draw(st.integers(0, 9)) > 0:
        body["model"] = draw(models)
    key, values = ("messages", messages) if chat else ("prompt", prompts)
    if draw(st.integers(0, 9)) > 0:
        body[key] = draw(values)
    for name in draw(st.lists(st.sampled_from(sorted(FIELD_VALUES)), max_size=4, unique=True)):
        body[name] = draw(FIELD_VALUES[name])
    return body


def encoded(body) -> bytes:
    return json.dumps(body).encode()  # NaN and Infinity as Python writes them, which the gateway must read


raw_bodies = (
    st.binary(max_size=200)
    | json_values.map(encoded)
    | st.integers(1, 3000).map(lambda depth: b"[" * depth + b"]" * depth)
    | st.builds(lambda depth: b'{"model": "dense", "prompt": ' + b"[" * depth, st.integers(1, 3000))
)


# -- the request check alone -------------------------------------------------------------------------
@settings(FUZZ, max_examples=400)
@given(raw=raw_bodies | openai_bodies(chat=False).map(encoded) | openai_bodies(chat=True).map(encoded))
def test_any_body_is_a_checked_request_or_a_4xx(raw):
    for schema in (CompletionRequest, ChatCompletionRequest):
        try:
            data, parsed = parse_request(raw, schema)
        except GatewayError as error:
            assert 400 <= error.status < 500, error.message
            assert error.message
        else:
            assert isinstance(data, dict) and parsed.model == data["model"]


# -- the gateway over HTTP ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gateway():
    backends = {name: serve_in_thread(create_fake_app(name), free_port()) for name in VARIANTS}
    specs = [BackendSpec(name, url=server.url) for name, server in backends.items()]
    specs[1].metadata.aliases = ["ppl-best"]
    settings_ = GatewaySettings(
        backends=specs,
        experiments={"exp": EXPERIMENT},
        api_key=API_KEY,
        admin_token=ADMIN_TOKEN,
        max_body_bytes=64 * 1024,
    )
    server = serve_in_thread(create_app(settings_), free_port())
    yield server
    server.stop()
    for backend in backends.values():
        backend.stop()


# Visible ASCII: what an HTTP client can send at all (no leading or trailing space, no control characters).
header_values = st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=10)


@settings(FUZZ, max_examples=150)
@given(
    chat=st.booleans(),
    body=st.data(),
    arm=st.none() | st.sampled_from(["dense", "dark", "ppl-v"]) | header_values,
    user=st.none() | header_values,
)
def test_gateway_never_answers_5xx(gateway, chat, body, arm, user):
    content = body.draw(openai_bodies(chat).map(encoded) | raw_bodies)
    headers = {"authorization": f"Bearer {API_KEY}", "content-type": "application/json"}
    if arm is not None:
        headers["x-depthprune-arm"] = arm
    if user is not None:
        headers["x-depthprune-user"] = user
    path = "/v1/chat/completions" if chat else "/v1/completions"
    response = httpx.post(f"{gateway.url}{path}", content=content, headers=headers, timeout=30)
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_a_whole_float_token_count_is_served(gateway, field):
    # Found by schemathesis: 1.0 passes the gateway's check (pydantic reads it as 1, as vLLM does) and is
    # forwarded as written; the fake backend failed on it with a 500, which the gateway reported as a 503.
    body = {"model": "dense", "messages": [{"role": "user", "content": "hi"}], field: 2.0}
    headers = {"authorization": f"Bearer {API_KEY}"}
    response = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 2


# -- schemathesis against the gateway's own schema ---------------------------------------------------
def test_schemathesis_finds_no_5xx_in_the_gateway_schema(gateway):
    pytest.importorskip("schemathesis")
    # In a process of its own: depthprune.testing.schema_fuzz says which CPython bug makes this necessary.
    command = [
        sys.executable,
        "-m",
        "depthprune.testing.schema_fuzz",
        gateway.url,
        "--api-key",
        API_KEY,
        "--admin-token",
        ADMIN_TOKEN,
        "--served",
        ",".join([*VARIANTS, "exp", "ppl-best"]),
    ]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    result = json.loads(finished.stdout.splitlines()[-1])
    assert set(result["paths"]) >= {"/v1/completions", "/admin/experiments/{name}"}
    statuses = result["statuses"]
    assert 200 in statuses and any(400 <= status < 500 for status in statuses)
