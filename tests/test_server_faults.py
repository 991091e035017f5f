"""Fault handling of the gateway: a backend that dies or hangs is marked down, its requests get 503 or go
to a fallback arm, a managed backend is restarted, and the other variants keep serving.

Managed backends here are real processes started with vLLM's command line, running the fake server
(:mod:`depthprune.testing.fake_vllm`) instead of the engine, so process management is exercised in seconds.
Run: ``.venv/bin/python -m pytest tests/test_server_faults.py -q``
"""

from __future__ import annotations

import asyncio
import os
import signal

import httpx
import pytest

from depthprune.testing.fake_vllm import create_fake_app, serve_in_thread
from depthprune.testing.servers import free_port, wait_until
from ground.core.errors import UserError
from server import BackendPool, BackendSpec, BackendStartError, GatewaySettings, VllmOptions, create_app

FAST_HEALTH = dict(health_interval_s=0.2, health_timeout_s=0.3)


def fake_process_options(tmp_path, **overrides) -> VllmOptions:
    """Managed backends that run the fake server instead of vLLM (same command line)."""
    options = dict(server_module="depthprune.testing.fake_vllm", start_timeout_s=60, log_dir=str(tmp_path))
    return VllmOptions(**{**options, **overrides})


def post(gateway, model: str, **headers) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/v1/completions",
        json={"model": model, "prompt": "w5", "max_tokens": 2},
        headers=headers,
        timeout=30,
    )


def metric(gateway, line_start: str) -> float:
    text = httpx.get(f"{gateway.url}/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start))


def test_remote_backend_death_gives_503_or_fallback_and_recovery_is_noticed():
    port_a = free_port()
    backend_a = serve_in_thread(create_fake_app("a"), port_a)
    backend_b = serve_in_thread(create_fake_app("b"), free_port())
    experiment = {
        "arms": [{"variant": "a", "weight": 1, "fallback": "b"}, {"variant": "b", "weight": 1}],
        "control": "b",
    }
    settings = GatewaySettings(
        backends=[BackendSpec("a", url=backend_a.url), BackendSpec("b", url=backend_b.url)],
        experiments={"ab": experiment},
        **FAST_HEALTH,
    )
    gateway = serve_in_thread(create_app(settings), free_port())
    try:
        assert post(gateway, "a").status_code == 200
        backend_a.stop()
        down = post(gateway, "a")
        assert down.status_code == 503, down.text
        error = down.json()["error"]
        assert error["type"] == "service_unavailable_error" and error["code"] == "backend_unavailable"
        assert "variant 'a' is unavailable" in error["message"] and down.headers["retry-after"]
        # The experiment's arm a falls back to b; plain b keeps serving.
        fallback = post(gateway, "ab", **{"x-depthprune-arm": "a"})
        assert fallback.status_code == 200 and fallback.headers["x-depthprune-variant"] == "b"
        assert (
            fallback.headers["x-depthprune-fallback-from"] == "a"
            and fallback.headers["x-depthprune-arm"] == "a"
        )
        assert post(gateway, "b").status_code == 200
        ready = httpx.get(f"{gateway.url}/ready")
        assert ready.status_code == 503 and ready.json()["backends"]["a"]["up"] is False
        assert metric(gateway, 'depthprune_gateway_fallbacks_total{arm="a"') == 1
        assert (
            metric(
                gateway,
                'depthprune_gateway_requests_total{arm="",endpoint="/v1/completions",'
                'experiment="",status="503",variant="a"}',
            )
            == 1
        )
        # The backend comes back on the same address: the monitor notices without a restart of the gateway.
        backend_a = serve_in_thread(create_fake_app("a"), port_a)
        wait_until(lambda: httpx.get(f"{gateway.url}/ready").status_code == 200, 10, "backend a back up")
        assert post(gateway, "a").status_code == 200
    finally:
        gateway.stop()
        backend_a.stop()
        backend_b.stop()


def test_backend_that_stops_answering_is_marked_down_and_back_up():
    fake = create_fake_app("slow")
    backend = serve_in_thread(fake, free_port())
    other = serve_in_thread(create_fake_app("ok"), free_port())
    settings = GatewaySettings(
        backends=[BackendSpec("slow", url=backend.url), BackendSpec("ok", url=other.url)], **FAST_HEALTH
    )
    gateway = serve_in_thread(create_app(settings), free_port())
    try:
        fake.state.hang_health = True
        wait_until(lambda: post(gateway, "slow").status_code == 503, 10, "hung backend marked down")
        assert "did not answer within" in post(gateway, "slow").json()["error"]["message"]
        assert post(gateway, "ok").status_code == 200
        fake.state.hang_health = False
        wait_until(lambda: post(gateway, "slow").status_code == 200, 10, "backend back up")
    finally:
        gateway.stop()
        backend.stop()
        other.stop()


def test_managed_backend_is_restarted_after_it_dies(tmp_path):
    settings = GatewaySettings(
        backends=[BackendSpec("m", model_dir="/models/fake-m"), BackendSpec("n", model_dir="/models/fake-n")],
        vllm=fake_process_options(tmp_path),
        **FAST_HEALTH,
    )
    gateway = serve_in_thread(
        create_app(settings),
        free_port(),
    )
    try:
        assert post(gateway, "m").status_code == 200
        first_pid = httpx.get(f"{gateway.url}/ready").json()["backends"]["m"]["pid"]
        os.kill(first_pid, signal.SIGKILL)
        # Until it is back, requests for it get a clear 503; the other variant is untouched.
        response = post(gateway, "m")
        assert response.status_code in (200, 503)  # 200 only if the restart already finished
        assert post(gateway, "n").status_code == 200

        def restarted():
            state = httpx.get(f"{gateway.url}/ready").json()["backends"]["m"]
            return state["up"] and state["pid"] != first_pid and state["restarts"] == 1

        wait_until(restarted, 60, "managed backend restarted")
        assert post(gateway, "m").status_code == 200
        assert metric(gateway, 'depthprune_gateway_backend_restarts_total{variant="m"}') == 1
        command_line = (tmp_path / "vllm-m.log").read_text()
        assert "--served-model-name m" in command_line and "--model /models/fake-m" in command_line
    finally:
        gateway.stop()
    assert wait_until(lambda: not _alive(first_pid), 5, "old process gone")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_backend_that_fails_to_start_reports_its_log_tail(tmp_path):
    settings = GatewaySettings(
        backends=[
            BackendSpec("ok", model_dir="/models/fake"),
            BackendSpec("broken", model_dir="/models/fake"),
        ],
        vllm=fake_process_options(tmp_path, extra_args=["--fail-start"]),
    )
    pool = BackendPool(settings)
    with pytest.raises(BackendStartError) as error:
        asyncio.run(pool.start_backends())
    message = str(error.value)
    assert "backend 'ok' did not start: its process exited with code 1" in message
    assert "fake engine failed to allocate the KV cache" in message
    assert all(backend.process is None for backend in pool.backends.values())


def test_start_timeout_stops_the_process(tmp_path):
    settings = GatewaySettings(
        backends=[BackendSpec("sleepy", model_dir="/models/fake")],
        vllm=fake_process_options(tmp_path, start_timeout_s=4, extra_args=["--hang-start"]),
    )
    pool = BackendPool(settings)
    with pytest.raises(BackendStartError, match="did not answer .*/health within 4 s") as error:
        asyncio.run(pool.start_backends())
    assert "loading weights forever" in str(error.value)
    assert pool["sleepy"].process is None


def probed_pool(outcomes: list) -> tuple[BackendPool, list[str]]:
    """A pool with one remote backend ``a``, up, whose health probes meet ``outcomes`` in order: an
    exception class to raise, or a status code."""
    settings = GatewaySettings(backends=[BackendSpec("a", url="http://127.0.0.1:9")], **FAST_HEALTH)
    pool, calls = BackendPool(settings), []

    def answer(request: httpx.Request) -> httpx.Response:
        outcome = outcomes[min(len(calls), len(outcomes) - 1)]
        calls.append(request.url.path)
        if isinstance(outcome, type):
            raise outcome("injected", request=request)
        return httpx.Response(outcome)

    pool._health_client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    pool["a"].up = pool["a"].model_info_known = True
    return pool, calls


def test_a_probe_whose_connection_breaks_once_keeps_a_healthy_backend_up():
    # What took healthy backends down (and restarted them) while another engine loaded: a /health whose
    # connection the server dropped. It is tried again on a new connection; only a failure there counts.
    pool, calls = probed_pool([httpx.RemoteProtocolError, 200])
    asyncio.run(pool.check(pool["a"]))
    assert pool["a"].up and calls == ["/health", "/health"]


def test_broken_probes_mark_a_backend_down_only_after_two_checks_and_a_refused_one_at_once():
    pool, _ = probed_pool([httpx.ReadError])
    asyncio.run(pool.check(pool["a"]))
    assert pool["a"].up  # one inconclusive check
    asyncio.run(pool.check(pool["a"]))
    assert not pool["a"].up and pool["a"].last_error.startswith("connection broken")

    refused, _ = probed_pool([httpx.ConnectError])
    asyncio.run(refused.check(refused["a"]))
    assert not refused["a"].up and refused["a"].last_error.startswith("unreachable")


def test_a_success_between_inconclusive_checks_starts_the_count_again():
    pool, _ = probed_pool([httpx.ReadTimeout, 200, httpx.ReadTimeout])
    for _ in range(3):
        asyncio.run(pool.check(pool["a"]))
    assert pool["a"].up


def replica_states(gateway, variant: str) -> list[dict]:
    return httpx.get(f"{gateway.url}/ready").json()["backends"][variant]["replicas"]


def test_a_variant_s_replicas_share_its_requests_and_a_dead_one_is_skipped_and_restarted(tmp_path):
    # No monitor checks during the test (30 s): only the request that meets the dead replica finds it out.
    settings = GatewaySettings(
        backends=[BackendSpec("m", model_dir="/models/fake-m", replicas=2)],
        vllm=fake_process_options(tmp_path),
        health_interval_s=30,
        health_timeout_s=0.5,
    )
    gateway = serve_in_thread(create_app(settings), free_port())
    try:
        assert [state["replica"] for state in replica_states(gateway, "m")] == [0, 1]
        assert all(post(gateway, "m").status_code == 200 for _ in range(4))
        # One request at a time: none outstanding, so the choice takes turns.
        for replica in ("0", "1"):
            assert metric(gateway, f'depthprune_gateway_replica_requests_total{{replica="{replica}"') == 2
        first = replica_states(gateway, "m")[0]
        os.kill(first["pid"], signal.SIGKILL)  # the supervisor; its server follows (parent-death signal)
        port = int(first["url"].rsplit(":", 1)[1])
        wait_until(lambda: not _listening(port), 10, "killed replica's port closed")
        # Every request is answered by the live replica, including the one whose connection was refused.
        assert all(post(gateway, "m").status_code == 200 for _ in range(4))
        # The first went to replica 0 (its turn), was refused and passed on to replica 1; a check then took
        # replica 0 out of rotation (a restart may bring it back before the last ones).
        sent = [metric(gateway, f'depthprune_gateway_replica_requests_total{{replica="{r}"') for r in "01"]
        assert sent[0] >= 3 and sent[1] >= 3 and sum(sent) >= 4 + 4 + 1
        assert httpx.get(f"{gateway.url}/ready").status_code == 200  # the variant is served throughout

        def restarted():
            states = replica_states(gateway, "m")
            replaced = states[0]["restarts"] == 1 and states[0]["pid"] != first["pid"]
            return replaced and all(state["up"] for state in states)

        wait_until(restarted, 60, "dead replica restarted")
        assert replica_states(gateway, "m")[1]["restarts"] == 0
        assert metric(gateway, 'depthprune_gateway_backend_restarts_total{variant="m"}') == 1
        assert metric(gateway, 'depthprune_gateway_replica_up{replica="0",variant="m"}') == 1
        assert metric(gateway, 'depthprune_gateway_backend_up{variant="m"}') == 1
        assert "--model /models/fake-m" in (tmp_path / "vllm-m-1.log").read_text()
        assert httpx.get(f"{gateway.url}/metrics/backends/m?replica=1").status_code == 200
        assert httpx.get(f"{gateway.url}/metrics/backends/m?replica=2").status_code == 404
    finally:
        gateway.stop()
    assert wait_until(lambda: not _alive(first["pid"]), 5, "old process gone")


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_the_replica_with_fewest_outstanding_requests_is_chosen_and_ties_take_turns():
    spec = BackendSpec("m", model_dir="/models/fake-m", replicas=3)
    pool = BackendPool(GatewaySettings(backends=[spec], vllm=VllmOptions(first_port=20000)))
    variant = pool.variants["m"]
    first, second, third = variant.replicas
    assert [r.key for r in variant.replicas] == ["m/0", "m/1", "m/2"] and pool["m/2"] is third
    assert [r.port for r in variant.replicas] == [20000, 20001, 20002]
    assert variant.choose_replica() is None and not variant.up  # nothing is up before the start
    for replica in variant.replicas:
        replica.up = True
    first.outstanding, second.outstanding, third.outstanding = 3, 1, 1
    assert [variant.choose_replica() for _ in range(4)] == [second, third, second, third]
    assert variant.choose_replica(exclude=[second]) is third
    third.mark_down("refused")
    assert variant.choose_replica() is second and variant.up and variant.last_error is None
    second.mark_down("gone")
    first.mark_down("gone too")
    assert variant.choose_replica() is None and not variant.up and variant.last_error == "gone too"
    status = variant.status()
    assert status["replicas_up"] == 0 and [s["replica"] for s in status["replicas"]] == [0, 1, 2]


def test_replicas_are_for_variants_started_here():
    with pytest.raises(UserError, match="only a variant started here"):
        BackendSpec("r", url="http://127.0.0.1:9", replicas=2)
    with pytest.raises(UserError, match="replicas must be >= 1"):
        BackendSpec("m", model_dir="/models/m", replicas=0)
