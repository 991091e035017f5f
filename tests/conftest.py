"""Shared fixtures: an isolated data directory per session, tiny random models on disk, the tiny demo model,
a tiny model with demo-style data, a throwaway PostgreSQL server, one real vLLM server of the tiny model, and
``run_cli``. What they build comes from the testing kit, :mod:`depthprune.testing`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One thread per worker (set before anything imports torch; subprocesses inherit it): two workers of two
    # OpenMP threads each on two cores spin at every barrier waiting for a thread that is not running (a 4-s
    # evaluator test ran for minutes)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# vLLM's CPU engines of the tests run their model worker inside the engine-core process: each engine is then
# two processes importing vLLM and torch, not three (a server of three engines started in 148 s instead of 222
# on this machine, 2026-11-28). Users' engines keep vLLM's default (the worker in a process of its own, its
# OpenMP threads bound); the shared tiny server below runs that way, so the suite serves through both, and
# VLLM_ENABLE_V1_MULTIPROCESSING=1 make test serves every engine as users do.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


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
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}  # as users' engines run
    with running(command, url, log, env=env, timeout_s=600):
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


# `make test` runs the suite in two pytest-xdist workers (-n 2 --dist loadscope --no-loadscope-reorder):
# starting a vLLM engine is a chain of single-threaded imports (API server, engine core, worker), so on two
# cores one worker's engines start while the other runs other tests. Every module is one unit of work (its
# module and session fixtures are built once, and the tests that scan the machine's processes never meet
# their own module in the other worker), the modules sharing the tiny vLLM server one unit together, and the
# slowest units go first so that neither worker is left with a long one at the end.
SHARED_UNITS = {"test_experiments.py": "vllm-tiny-server", "test_loadtest_vllm.py": "vllm-tiny-server"}
SLOWEST_FIRST = (
    "test_experiments_vllm.py",
    "test_demo.py",
    "test_server_vllm.py",
    "test_real_model.py",
    "test_experiments.py",
    "test_checkpoint.py",
    "test_work_queue.py",
    "test_study_ray.py",
    "test_study.py",
    "test_memo_journal.py",
    "test_heal.py",
    "test_study_seeds.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {module: position for position, module in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a module's own order is kept


@pytest.hookimpl(optionalhook=True)  # xdist's hook: pytest without xdist runs the suite in one process
def pytest_xdist_make_scheduler(config, log):
    """Units of work by module, SHARED_UNITS joined (xdist's own --dist loadgroup reads groups from node ids
    that pytest 9.2 no longer lets it rewrite: pytest-dev/pytest-xdist#1386)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return SHARED_UNITS.get(Path(module).name, module)

    return ModuleUnits(config, log)
