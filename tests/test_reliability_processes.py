"""Processes of managed backends under faults: nothing outlives the gateway, nothing of a dead server lingers.

The fast tests run the fake vLLM server (:mod:`depthprune.testing.fake_vllm`) as the managed backend, with an
``EngineCore`` stand-in: a child in the server's process group that ignores SIGTERM, as a wedged engine
worker does. The tests look for leftovers by a marker (the test's temporary directory) in the command lines.

Run: ``.venv/bin/python -m pytest tests/test_reliability_processes.py -q -p no:cacheprovider``
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from depthprune.testing.fake_vllm import create_fake_app, serve_in_thread
from depthprune.testing.servers import free_port, read_json_line, start_logged, stop, wait_until
from server import BackendPool, BackendSpec, GatewaySettings, VllmOptions, create_app

FAST_HEALTH = dict(health_interval_s=0.2, health_timeout_s=0.5)

SERVER_WITH_ENGINE = """\
import subprocess, sys
# The EngineCore stand-in: same process group, ignores SIGTERM, so only SIGKILL ends it.
subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)", "engine-core"])
from depthprune.testing.fake_vllm import main
main()
"""

GATEWAY = """\
import json, sys
from server import BackendSpec, GatewaySettings, VllmOptions, serve_gateway
options, names = json.loads(sys.argv[1]), sys.argv[2].split(",")
backends = [BackendSpec(name, model_dir=options["model_root"] + "/" + name) for name in names]
settings = GatewaySettings(backends=backends, vllm=VllmOptions(**options["vllm"]), port=int(sys.argv[3]))
def ready(pool):
    print(json.dumps({name: backend.status() for name, backend in pool.backends.items()}), flush=True)
serve_gateway(settings, log_level="warning", show_progress=False, on_ready=ready)
"""


def engine_options(tmp_path: Path, **overrides) -> VllmOptions:
    """Managed backends running the fake server with an engine stand-in (module in ``tmp_path``)."""
    (tmp_path / "server_with_engine.py").write_text(SERVER_WITH_ENGINE)
    python_path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    options = dict(
        server_module="server_with_engine",
        start_timeout_s=60,
        log_dir=str(tmp_path),
        env={"PYTHONPATH": python_path},
    )
    return VllmOptions(**{**options, **overrides})


def processes_of(tmp_path: Path, names: tuple[str, ...] = ("fake-m", "fake-n")) -> list[psutil.Process]:
    """Live processes of the backends started for this test: servers, engine stand-ins and supervisors."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        try:
            command_line = " ".join(process.info["cmdline"] or [])
            if process.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            markers = [f"{tmp_path}/{name}" for name in names]
            mine = any(marker in command_line for marker in markers)
            if mine or ("engine-core" in command_line and _descends_from(process, markers)):
                found.append(process)
        except psutil.Error:
            continue
    return found


def engine_stand_ins() -> list[psutil.Process]:
    """Every engine stand-in of this test session that is still alive (whatever its parent now)."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        try:
            if process.info["status"] != psutil.STATUS_ZOMBIE and process.info["cmdline"][-1:] == [
                "engine-core"
            ]:
                found.append(process)
        except (psutil.Error, TypeError):
            continue
    return found


def _descends_from(process: psutil.Process, markers: list[str]) -> bool:
    try:
        return any(marker in " ".join(parent.cmdline()) for parent in process.parents() for marker in markers)
    except psutil.Error:
        return False


def server_process(backend_pid: int, module: str = "server_with_engine") -> psutil.Process:
    """The fake server (the one listening) among the backend's processes: its command names the module."""
    leader = psutil.Process(backend_pid)
    for process in [leader, *leader.children(recursive=True)]:
        command_line = " ".join(process.cmdline())
        if module in command_line and "supervisor.py" not in command_line:
            return process
    raise AssertionError(f"no server process under {backend_pid}")


@pytest.fixture
def short_grace(monkeypatch):
    """Supervisors of in-process gateways wait 2 s, not 10, for the stand-in that ignores SIGTERM."""
    monkeypatch.setattr("server.backends.SUPERVISOR_GRACE_S", 2.0)


@pytest.fixture(autouse=True)
def no_stand_in_left_behind():
    """Each test starts and ends with no engine stand-in alive (a leftover would hide the next failure)."""
    for process in engine_stand_ins():
        process.kill()
    yield
    leftovers = engine_stand_ins()
    for process in leftovers:
        process.kill()
    assert not leftovers, f"engine stand-ins left behind: {[p.pid for p in leftovers]}"


def test_stop_reaps_the_group_after_its_leader_was_killed(tmp_path):
    settings = GatewaySettings(
        backends=[BackendSpec("m", model_dir=str(tmp_path / "fake-m"))], vllm=engine_options(tmp_path)
    )
    pool = BackendPool(settings)
    asyncio.run(pool.start_backends())
    backend = pool["m"]
    wait_until(lambda: len(engine_stand_ins()) == 1, 30, "the engine stand-in")
    os.kill(backend.process.pid, signal.SIGKILL)
    wait_until(lambda: backend.process.poll() is not None, 10, "the leader's death")
    backend.stop()
    wait_until(lambda: not processes_of(tmp_path) and not engine_stand_ins(), 5, "the whole group gone")


def test_a_killed_server_takes_its_engine_with_it_and_is_restarted(tmp_path, short_grace):
    settings = GatewaySettings(
        backends=[
            BackendSpec("m", model_dir=str(tmp_path / "fake-m")),
            BackendSpec("n", model_dir=str(tmp_path / "fake-n")),
        ],
        vllm=engine_options(tmp_path),
        **FAST_HEALTH,
    )
    gateway = serve_in_thread(create_app(settings), free_port())
    try:
        wait_until(lambda: len(engine_stand_ins()) == 2, 30, "two engine stand-ins")
        first_pid = httpx.get(f"{gateway.url}/ready").json()["backends"]["m"]["pid"]
        server = server_process(first_pid)
        engines_before = {process.pid for process in engine_stand_ins()}
        server.kill()  # kill -9 of the API server only
        post = {"model": "n", "prompt": "w5", "max_tokens": 2}
        assert httpx.post(f"{gateway.url}/v1/completions", json=post, timeout=30).status_code == 200

        def restarted():
            state = httpx.get(f"{gateway.url}/ready").json()["backends"]["m"]
            return state["up"] and state["pid"] != first_pid and state["restarts"] >= 1

        wait_until(restarted, 60, "backend m restarted")
        engines_after = {process.pid for process in engine_stand_ins()}
        assert len(engines_after) == 2 and len(engines_before & engines_after) == 1  # m's old engine is gone
    finally:
        gateway.stop()
    wait_until(lambda: not processes_of(tmp_path), 20, "no process left after the gateway stopped")


def test_kill_9_of_the_gateway_leaves_no_backend_process(tmp_path):
    options = {
        "model_root": str(tmp_path),
        "vllm": {**engine_options(tmp_path).__dict__, "start_timeout_s": 60},
    }
    port = free_port()
    command = [sys.executable, "-c", GATEWAY, json.dumps(options), "fake-m,fake-n", str(port)]
    gateway = start_logged(command, tmp_path / "gateway.log", stdout_pipe=True)
    try:
        summary = read_json_line(gateway, tmp_path / "gateway.log", timeout_s=120)
        assert all(state["up"] for state in summary.values())
        assert len(processes_of(tmp_path)) >= 4 and len(engine_stand_ins()) == 2
        os.kill(gateway.pid, signal.SIGKILL)
        gateway.wait(timeout=10)
        wait_until(lambda: not processes_of(tmp_path) and not engine_stand_ins(), 30, "every backend gone")
    finally:
        stop(gateway, timeout_s=5)
        gateway.stdout.close()


def test_managed_servers_get_the_gateway_key_in_their_environment_not_on_their_command_line(
    tmp_path, short_grace
):
    settings = GatewaySettings(
        backends=[BackendSpec("m", model_dir=str(tmp_path / "fake-m"))],
        vllm=engine_options(tmp_path),
        api_key="s3cret-key",
    )
    pool = BackendPool(settings)
    asyncio.run(pool.start_backends())
    try:
        server = server_process(pool["m"].process.pid)
        assert server.environ().get("VLLM_API_KEY") == "s3cret-key"
        assert not any("s3cret-key" in " ".join(p.cmdline()) for p in processes_of(tmp_path))
    finally:
        pool.stop_processes()


def test_health_checks_and_proxied_requests_carry_the_key(tmp_path):
    """A backend that requires the key (as vLLM with VLLM_API_KEY does on /v1) is healthy and serves."""
    fake = create_fake_app("guarded")
    seen: list[str | None] = []

    @fake.middleware("http")
    async def require_key(request, call_next):
        seen.append(request.headers.get("authorization"))
        if request.url.path.startswith("/v1") and request.headers.get("authorization") != "Bearer k3y":
            from fastapi.responses import JSONResponse

            return JSONResponse({"error": {"message": "Unauthorized"}}, status_code=401)
        return await call_next(request)

    backend = serve_in_thread(fake, free_port())
    settings = GatewaySettings(
        backends=[BackendSpec("guarded", url=backend.url)], api_key="k3y", **FAST_HEALTH
    )
    gateway = serve_in_thread(create_app(settings), free_port())
    try:
        key = {"authorization": "Bearer k3y"}
        response = httpx.post(
            f"{gateway.url}/v1/completions",
            json={"model": "guarded", "prompt": "w5", "max_tokens": 2},
            headers=key,
            timeout=30,
        )
        assert response.status_code == 200, response.text
        assert seen and all(header == "Bearer k3y" for header in seen)
    finally:
        gateway.stop()
        backend.stop()


def registry_with_two_variants(tmp_path: Path) -> str:
    """A registry URL where variants ``fake-m`` and ``fake-n`` have checkpoints (weights and a config)."""
    from depthprune.testing.variants import fake_checkpoint, register_example_base, register_example_variant
    from registry import open_registry

    url = f"sqlite:///{tmp_path / 'registry.db'}"
    with open_registry(url) as registry:
        register_example_base(registry)
        for name, removed in (("fake-m", [1, 3]), ("fake-n", [2, 4])):
            checkpoint = fake_checkpoint(tmp_path / name, content=name.encode())
            (checkpoint / "config.json").write_text('{"num_hidden_layers": 4}')
            register_example_variant(registry, removed, checkpoint=checkpoint, name=name)
    return url


def registered_pool(tmp_path: Path, url: str) -> BackendPool:
    """The pool of ``depthprune serve --variants fake-m,fake-n``: resolved in the registry, files checked."""
    from server.cli import build_settings, registered_files_check

    vllm = engine_options(tmp_path).__dict__
    settings = build_settings({"variants": "fake-m,fake-n", "registry": url}, {"vllm": vllm, **FAST_HEALTH})
    return BackendPool(settings, check_before_start=registered_files_check(settings, url))


def test_a_tampered_checkpoint_is_refused_at_restart_and_the_others_keep_serving(tmp_path, short_grace):
    pool = registered_pool(tmp_path, registry_with_two_variants(tmp_path))
    gateway = serve_in_thread(create_app(pool.settings, pool), free_port())
    try:
        first_pid = httpx.get(f"{gateway.url}/ready").json()["backends"]["fake-m"]["pid"]
        (tmp_path / "fake-m" / "config.json").write_text('{"num_hidden_layers": 2}')
        server_process(first_pid).kill()

        def refused():
            state = httpx.get(f"{gateway.url}/ready").json()["backends"]["fake-m"]
            return not state["up"] and "config.json" in (state["error"] or "") and state["pid"] is None

        wait_until(refused, 30, "fake-m refused")
        state = httpx.get(f"{gateway.url}/ready").json()["backends"]["fake-m"]
        assert "refused" in state["error"] and "changed config.json" in state["error"], state
        post = {"model": "fake-n", "prompt": "w5", "max_tokens": 2}
        assert httpx.post(f"{gateway.url}/v1/completions", json=post, timeout=30).status_code == 200
        restarts = state["restarts"]
        wait_until(lambda: pool["fake-m"].restarting is False, 10, "no restart running")
        time.sleep(1.5)  # several health intervals: a refused backend is not restarted again and again
        again = httpx.get(f"{gateway.url}/ready").json()["backends"]["fake-m"]
        assert again["restarts"] == restarts and again["pid"] is None and not again["up"]
        left = [" ".join(process.cmdline()) for process in processes_of(tmp_path, ("fake-m",))]
        assert left == []
    finally:
        gateway.stop()


def test_a_tampered_checkpoint_is_refused_at_the_first_start(tmp_path):
    from server.backends import BackendStartError

    url = registry_with_two_variants(tmp_path)
    pool = registered_pool(tmp_path, url)
    (tmp_path / "fake-n" / "model.safetensors").write_bytes(b"other weights")
    with pytest.raises(BackendStartError, match="changed model.safetensors"):
        asyncio.run(pool.start_backends())
    assert not processes_of(tmp_path)


def serve_config(tmp_path: Path) -> Path:
    """A ``serve --config`` file whose managed backends run the fake server, with fast health checks."""
    config = tmp_path / "gateway.json"
    vllm = {"server_module": "depthprune.testing.fake_vllm", "log_dir": str(tmp_path), "start_timeout_s": 60}
    config.write_text(json.dumps({"vllm": vllm, "health_interval_s": 0.2}))
    return config


def test_removing_the_checkpoint_of_a_served_variant_needs_force_and_then_keeps_it_down(
    tmp_path, monkeypatch
):
    from depthprune.testing.cli import run_cli
    from depthprune.testing.servers import running_gateway
    from registry import open_registry

    url, home = registry_with_two_variants(tmp_path), tmp_path / "home"
    options = ("--registry", url, "--config", str(serve_config(tmp_path)), "--log-level", "warning")
    monkeypatch.setenv("DEPTHPRUNE_HOME", str(home))
    with running_gateway(
        "fake-m,fake-n", tmp_path / "serve.log", *options, env={"DEPTHPRUNE_HOME": str(home)}
    ) as gateway:
        code, _, error = run_cli("variants", "rm", "fake-m", "--delete-checkpoint", "--registry", url)
        assert code != 0 and len(error.strip().splitlines()) == 1, error
        assert "served by the gateway" in error and str(gateway.process.pid) in error and "--force" in error
        assert (tmp_path / "fake-m" / "model.safetensors").is_file()
        with open_registry(url) as registry:
            assert registry.resolve("fake-m").name == "fake-m"

        code, out, error = run_cli(
            "variants", "rm", "fake-m", "--delete-checkpoint", "--force", "--registry", url
        )
        assert code == 0 and not (tmp_path / "fake-m").exists(), error
        server_process(gateway.summary["variants"]["fake-m"]["pid"], "fake_vllm").kill()

        def refused():
            state = httpx.get(f"{gateway.url}/ready").json()["backends"]["fake-m"]
            return not state["up"] and "refused" in (state["error"] or "") and state

        state = wait_until(refused, 30, "fake-m refused")
        assert "missing" in state["error"], state
        time.sleep(1.5)
        assert httpx.get(f"{gateway.url}/ready").json()["backends"]["fake-m"]["restarts"] == state["restarts"]
        post = {"model": "fake-n", "prompt": "w5", "max_tokens": 2}
        assert httpx.post(f"{gateway.url}/v1/completions", json=post, timeout=30).status_code == 200
    assert not list((home / "serving").glob("*.json"))  # a gateway that stopped gives its lease back


def test_a_lease_left_by_a_killed_gateway_does_not_block_removal(tmp_path, monkeypatch):
    from depthprune.testing.cli import run_cli
    from registry.serving import write_lease

    url, home = registry_with_two_variants(tmp_path), tmp_path / "home"
    monkeypatch.setenv("DEPTHPRUNE_HOME", str(home))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lease = write_lease(
        [{"name": "fake-m", "checkpoint_path": str(tmp_path / "fake-m")}], url="http://x", pid=dead.pid
    )
    code, _, error = run_cli("variants", "rm", "fake-m", "--delete-checkpoint", "--registry", url)
    assert code == 0 and not (tmp_path / "fake-m").exists() and not lease.exists(), error


def test_a_live_gateway_blocks_only_the_checkpoint_directory_it_serves(tmp_path, monkeypatch):
    """Variant ids are per registry: a gateway serving another directory under the same id blocks nothing."""
    from depthprune.testing.cli import run_cli
    from registry import open_registry
    from registry.serving import remove_lease, write_lease

    url, home = registry_with_two_variants(tmp_path), tmp_path / "home"
    monkeypatch.setenv("DEPTHPRUNE_HOME", str(home))
    with open_registry(url) as registry:
        m_id = registry.resolve("fake-m").id
    elsewhere = {"name": "other", "variant_id": m_id, "checkpoint_path": str(tmp_path / "other" / "v")}
    served_n = {"name": "fake-n", "variant_id": 99, "checkpoint_path": str(tmp_path / "x" / ".." / "fake-n")}
    lease = write_lease([elsewhere, served_n], url="http://gateway:1")  # this process: alive
    try:
        code, _, error = run_cli("variants", "rm", "fake-n", "--delete-checkpoint", "--registry", url)
        assert code != 0 and "http://gateway:1" in error and (tmp_path / "fake-n").is_dir(), error
        code, _, error = run_cli("variants", "rm", "fake-m", "--delete-checkpoint", "--registry", url)
        assert code == 0 and not (tmp_path / "fake-m").exists(), error
        assert lease.exists()
    finally:
        remove_lease(lease)
