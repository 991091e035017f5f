"""Shared fixtures: an isolated data directory per session, tiny random models on disk, the tiny demo model,
a tiny model with demo-style data, a throwaway PostgreSQL server, one real vLLM server of the tiny model, and
``run_cli``. What they build comes from the testing kit, :mod:`depthprune.testing`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def isolated_home(tmp_path_factory) -> Path:
    """Every test session gets its own DEPTHPRUNE_HOME and SQLite registry, never the user's."""
    home = tmp_path_factory.mktemp("depthprune-home")
    previous = {key: os.environ.get(key) for key in ("DEPTHPRUNE_HOME", "DEPTHPRUNE_REGISTRY_URL")}
    os.environ["DEPTHPRUNE_HOME"] = str(home)
    os.environ.pop("DEPTHPRUNE_REGISTRY_URL", None)
    yield home
    for key, value in previous.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory):
    """``architecture -> directory`` of a saved tiny random model, made once per session on demand."""
    from depthprune.testing.models import save_tiny_model

    made: dict[str, Path] = {}

    def get(architecture: str) -> Path:
        if architecture not in made:
            directory = tmp_path_factory.mktemp(f"tiny-{architecture}")
            made[architecture] = save_tiny_model(architecture, directory)
        return made[architecture]

    return get


@pytest.fixture(scope="session")
def vllm_tiny_server(tiny_model_dirs, tmp_path_factory):
    """Base URL of a real vLLM OpenAI server (CPU engine) serving the tiny random Llama as ``dense``, ``copy``
    and ``twin``, started once per session: the engine takes about a minute to start, so the load tests and
    the experiment tests share it (each uses two of the names). Eager (no torch.compile): none of them
    measures the engine's own speed, and compiling takes most of the start on 2 cores."""
    from depthprune.testing.servers import free_port, running, vllm_command

    port = free_port()
    command = vllm_command(
        tiny_model_dirs("llama"),
        ["dense", "copy", "twin"],
        port,
        extra_args=["--max-num-seqs", "16", "--enforce-eager"],
    )
    log = tmp_path_factory.mktemp("vllm-tiny") / "server.log"
    url = f"http://127.0.0.1:{port}"
    with running(command, url, log, env={"VLLM_CPU_KVCACHE_SPACE": "1"}, timeout_s=600):
        yield url


@pytest.fixture
def run_cli():
    """The kit's ``run_cli``: ``depthprune ARGS...`` in-process, returning ``(exit code, stdout, stderr)``."""
    from depthprune.testing.cli import run_cli

    return run_cli


@pytest.fixture(scope="session")
def demo_tiny_dir(isolated_home) -> Path:
    """Directory of the tiny demo model (``DemoRecipe.tiny()``: 8 blocks, hidden 64), built once per session.

    Built into the session's ``DEPTHPRUNE_HOME``, with its data files in ``data/*.jsonl``.
    """
    from ground.demo.model import ensure_demo_model
    from ground.demo.recipe import DemoRecipe

    return ensure_demo_model(DemoRecipe.tiny(), progress=False)


@pytest.fixture(scope="module")
def tiny_demo_like(tmp_path_factory, tiny_model_dirs):
    """A tiny llama with hand-made demo-style data: text and questions, calibration and test splits."""
    import random

    from depthprune.testing.data import demo_like_model, random_questions, random_texts

    rng = random.Random(1)
    data = {}
    for split in ("calibration", "test"):
        data[f"text_{split}"] = random_texts(rng, rows=12, words=40)
        data[f"qa_{split}"] = random_questions(rng, rows=10, choices=3, context_words=5, labels="cycle")
    return demo_like_model(tiny_model_dirs("llama"), tmp_path_factory.mktemp("demo-like") / "model", data)


@pytest.fixture(scope="session")
def postgres_admin_url():
    """URL of a PostgreSQL server where tests may create databases, for the whole session: the one in
    ``DEPTHPRUNE_TEST_POSTGRES_URL``, else a throwaway server (skipped without its binaries, unless
    ``DEPTHPRUNE_REQUIRE_POSTGRES`` is set)."""
    from depthprune.testing.postgres import TemporaryPostgres, find_postgres_bin

    given = os.environ.get("DEPTHPRUNE_TEST_POSTGRES_URL")
    if given:
        yield given
        return
    if find_postgres_bin() is None:
        message = "no PostgreSQL server binaries (initdb, pg_ctl) and no DEPTHPRUNE_TEST_POSTGRES_URL"
        if os.environ.get("DEPTHPRUNE_REQUIRE_POSTGRES"):
            pytest.fail(f"DEPTHPRUNE_REQUIRE_POSTGRES is set but {message}")
        pytest.skip(message)
    with TemporaryPostgres() as server:
        yield server.admin_url
