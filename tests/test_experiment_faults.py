"""Experiments under bad input and faults (issue 45): what the admin API accepts can always be served, and
what it answers is true. Spec limits and strict types, names that cannot break a header or a metric label
even when stored behind the API's back, changes under a held write lock (SQLite and PostgreSQL), a replica
that has never read its registry, metric series of deleted arms, and no redirect built from the Host header.

Run: ``.venv/bin/python -m pytest tests/test_experiment_faults.py -q``
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
import uuid
from contextlib import contextmanager
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from depthprune.testing.gateways import ADMIN, fake_backends, gateway_replica
from depthprune.testing.postgres import create_database_at, drop_database_at
from depthprune.testing.servers import wait_until
from registry import open_registry
from registry.experiments import (
    MAX_ARMS,
    MAX_EXPERIMENTS,
    ExperimentStore,
    TooManyExperiments,
    WriteTimeout,
)
from server.experiment_sync import parse_spec

EVEN = {"arms": [{"variant": "dense", "weight": 1}, {"variant": "twin", "weight": 1}]}
ALL_TWIN = {"arms": [{"variant": "dense", "weight": 0}, {"variant": "twin", "weight": 1}]}


@pytest.fixture(scope="module")
def backends():
    with fake_backends("dense", "twin") as urls:
        yield urls


@pytest.fixture
def sqlite_url(tmp_path):
    return f"sqlite:///{tmp_path / 'registry.db'}"


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def shared_url(request, sqlite_url):
    """An empty registry: a SQLite file, or a PostgreSQL database of the testing kit's server."""
    if request.param == "sqlite":
        yield sqlite_url
        return
    admin_url = request.getfixturevalue("postgres_admin_url")
    name = f"faults_{uuid.uuid4().hex[:12]}"
    yield create_database_at(admin_url, name)
    drop_database_at(admin_url, name)


def libpq_dsn(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@contextmanager
def held_write_lock(url: str):
    """Another client holds the registry's write lock on ``experiments`` for the length of the block (reads
    go on: SQLite's WAL, PostgreSQL's EXCLUSIVE mode lets plain SELECTs through)."""
    if url.startswith("sqlite"):
        connection = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        connection.execute("BEGIN EXCLUSIVE")
    else:
        import psycopg

        connection = psycopg.connect(libpq_dsn(url))
        connection.execute("LOCK TABLE experiments IN EXCLUSIVE MODE")
    try:
        yield
    finally:
        connection.rollback()
        connection.close()


def complete(gateway: str, model: str, **fields) -> httpx.Response:
    return httpx.post(f"{gateway}/v1/completions", json={"model": model, "prompt": "w3", **fields})


# -- one validation for every writer ------------------------------------------------------------------------
def arm(name: str, **fields) -> dict:
    return {"variant": "dense", "name": name, **fields}


REFUSED_SPECS = [
    # (spec, the field the refusal names)
    ({"arms": [arm("実験")]}, "arms.0.name"),
    ({"arms": [arm("a\nb")]}, "arms.0.name"),
    ({"arms": [arm("ab\n")]}, "arms.0.name"),  # `$` would have let a final newline through
    ({"arms": [arm("a\r\nset-cookie: x")]}, "arms.0.name"),
    ({"arms": [arm("a\x00b")]}, "arms.0.name"),
    ({"arms": [arm("a b")]}, "arms.0.name"),
    ({"arms": [arm("-lead")]}, "arms.0.name"),
    ({"arms": [arm("x" * 10_000)]}, "arms.0.name"),
    ({"arms": [arm(f"a{i}") for i in range(10_000)]}, "arms"),
    ({"arms": [arm(f"a{i}") for i in range(MAX_ARMS + 1)]}, "arms"),
    ({"arms": [arm("a", weight=True)]}, "arms.0.weight"),
    ({"arms": [arm("a", weight="1")]}, "arms.0.weight"),
    ({"arms": [arm("a", weight=1e300)]}, "arms.0.weight"),
    ({"arms": [arm("a")], "sticky": "yes"}, "sticky"),
    ({"arms": [arm("a")], "sticky": 1}, "sticky"),
    ({"arms": [arm(7)]}, "arms.0.name"),
    ({"arms": [{"variant": "dense\n"}]}, "arms.0.variant"),
    ({"arms": [arm("a", fallback="x\ty")]}, "arms.0.fallback"),
    ({"arms": [arm("a")], "fallback": "é"}, "fallback"),
    ({"arms": [arm("a")], "forcible": ["a"] * (MAX_ARMS + 1)}, "forcible"),
]


@pytest.mark.parametrize(("spec", "field"), REFUSED_SPECS, ids=range(len(REFUSED_SPECS)))
def test_every_writer_refuses_what_a_header_or_label_cannot_carry(spec, field):
    with pytest.raises(ValueError, match=field.split(".")[-1]):  # config file and CLI: parse_spec
        parse_spec("ab", spec)


@pytest.mark.parametrize("name", ["ab\n", "a b", "実験", "x" * 129, "1234", "dense", "-ab"])
def test_an_experiment_name_is_checked_like_an_arm_name(name):
    with pytest.raises(ValueError, match="experiment"):
        parse_spec(name, EVEN)


def test_the_admin_api_refuses_with_a_400_naming_the_field_and_writes_nothing(backends, sqlite_url):
    with gateway_replica(backends, sqlite_url, {"ab": EVEN}) as gateway:
        for spec, field in REFUSED_SPECS:
            response = httpx.put(f"{gateway}/admin/experiments/ab", json=spec, headers=ADMIN)
            error = response.json()["error"]
            assert response.status_code == 400, (field, response.text[:200])
            assert error["param"] == field and error["code"] == "invalid_experiment"
        for name in ("ab%0A", "ab%0D%0Ax:y", "%E5%AE%9F", "x" * 129):
            response = httpx.put(f"{gateway}/admin/experiments/{name}", json=EVEN, headers=ADMIN)
            assert response.status_code == 400 and response.json()["error"]["param"] == "name", name
        history = httpx.get(f"{gateway}/admin/experiments/ab/history", headers=ADMIN).json()["changes"]
        assert [change["action"] for change in history] == ["seed"]  # nothing written
        assert len(httpx.get(f"{gateway}/v1/models").content) < 4_000
    with open_registry(sqlite_url) as registry:
        assert ExperimentStore(registry).versions() == {"ab": 1}


def test_the_cli_and_a_config_file_refuse_with_the_same_check(backends, sqlite_url, run_cli):
    from ground.core.errors import UserError
    from server import BackendSpec, GatewaySettings, create_app

    spec = json.dumps({"arms": [arm("a b")]})
    code, _, err = run_cli("experiments", "set", "ab", "--spec", spec, "--registry", sqlite_url)
    assert code == 2 and "arms.0.name" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli("experiments", "set", "ab\n", "--spec", json.dumps(EVEN), "--registry", sqlite_url)
    assert code == 2 and "experiment" in err
    with open_registry(sqlite_url) as registry:
        assert ExperimentStore(registry).versions() == {}
    config = GatewaySettings(
        backends=[BackendSpec(name, url=url) for name, url in backends.items()],
        experiments={"ab": {"arms": [arm("x" * 200)]}},
    )
    with pytest.raises(UserError, match="arms.0.name"):
        create_app(config)


@pytest.mark.parametrize("where", ["memory", "registry"])
def test_a_registry_holds_a_bounded_number_of_experiments(backends, sqlite_url, where):
    with gateway_replica(backends, sqlite_url if where == "registry" else None) as gateway:
        for index in range(MAX_EXPERIMENTS):
            put = httpx.put(f"{gateway}/admin/experiments/e{index}", json=EVEN, headers=ADMIN)
            assert put.status_code == 200
        refused = httpx.put(f"{gateway}/admin/experiments/one-more", json=EVEN, headers=ADMIN)
        assert (
            refused.status_code == 400 and f"at most {MAX_EXPERIMENTS}" in refused.json()["error"]["message"]
        )
        assert httpx.put(f"{gateway}/admin/experiments/e0", json=ALL_TWIN, headers=ADMIN).status_code == 200
        assert httpx.delete(f"{gateway}/admin/experiments/e1", headers=ADMIN).status_code == 200
        assert httpx.put(f"{gateway}/admin/experiments/one-more", json=EVEN, headers=ADMIN).status_code == 200


def test_the_store_refuses_a_huge_spec_and_one_experiment_too_many(sqlite_url):
    with open_registry(sqlite_url) as registry:
        store = ExperimentStore(registry)
        with pytest.raises(Exception, match="bytes as JSON"):
            store.set("big", {"arms": [{"variant": "x" * 20_000}]}, actor="test")
        for index in range(MAX_EXPERIMENTS):
            store.set(f"e{index}", EVEN, actor="test")
        with pytest.raises(TooManyExperiments):
            store.set("one-more", EVEN, actor="test")
        assert "one-more" not in store.versions()


# -- what reaches a header or a label is safe, whatever is stored -------------------------------------------
UNSAFE = {
    "arms": [
        {"variant": "dense", "name": "実験", "weight": 1},
        {"variant": "twin", "name": "a\r\nset-cookie: x", "weight": 1},
    ]
}


def test_a_spec_stored_behind_the_apis_back_never_breaks_serving(backends, sqlite_url):
    with open_registry(sqlite_url) as registry:
        store = ExperimentStore(registry)
        store.set("ab", EVEN, actor="test")
        with registry.engine.begin() as connection:  # a writer that skips every check
            connection.exec_driver_sql(
                "INSERT INTO experiments (name, spec, version, updated_by, updated_at) "
                "VALUES (?, ?, 1, 'sql', CURRENT_TIMESTAMP)",
                ("bad\n", '{"arms": [{"variant": "dense", "name": "a\\nb"}], "sticky": "yes"}'),
            )
            connection.exec_driver_sql(
                "INSERT INTO experiments (name, spec, version, updated_by, updated_at) "
                "VALUES ('unsafe', ?, 1, 'sql', CURRENT_TIMESTAMP)",
                (json.dumps(UNSAFE),),
            )
    with gateway_replica(backends, sqlite_url) as gateway:
        ready = httpx.get(f"{gateway}/ready")
        assert ready.status_code == 200 and ready.json()["experiments"]["in_sync"]
        assert set(ready.json()["experiments"]["not_served"]) == {"bad\n", "unsafe"}
        assert {complete(gateway, "ab", user=f"u{i}").status_code for i in range(6)} == {200}
        assert complete(gateway, "unsafe").status_code == 404  # not routed here, and said so in /ready
        assert httpx.get(f"{gateway}/metrics").status_code == 200
        assert httpx.get(f"{gateway}/v1/models").status_code == 200


def test_names_that_reach_headers_and_labels_are_encoded_even_past_every_check(backends):
    from starlette.testclient import TestClient

    from server import BackendSpec, GatewaySettings, create_app
    from server.protocol import ArmSpec, ExperimentSpec

    settings = GatewaySettings(backends=[BackendSpec(name, url=url) for name, url in backends.items()])
    app = create_app(settings)
    arms = [ArmSpec.model_construct(**arm, objective=None, fallback=None) for arm in UNSAFE["arms"]]
    spec = ExperimentSpec.model_construct(arms=arms, sticky=True, fallback=None, forcible=[])
    app.state.router.set_experiment("raw\n", spec)  # code that skipped every check
    with TestClient(app) as client:
        answers = [
            client.post("/v1/completions", json={"model": "raw\n", "prompt": "w3", "user": f"u{i}"})
            for i in range(12)
        ]
        assert {answer.status_code for answer in answers} == {200}
        assert {answer.headers["x-depthprune-arm"] for answer in answers} == {
            "%E5%AE%9F%E9%A8%93",
            "a%0D%0Aset-cookie:%20x",
        }
        assert {answer.headers["x-depthprune-experiment"] for answer in answers} == {"raw%0A"}
        assert not any("set-cookie" in answer.headers for answer in answers)
        metrics = client.get("/metrics").text
        assert 'arm="%E5%AE%9F%E9%A8%93"' in metrics and 'experiment="raw%0A"' in metrics


# -- truthful failures ---------------------------------------------------------------------------------------
def test_a_change_answered_5xx_under_a_held_lock_changed_nothing(backends, shared_url, monkeypatch):
    monkeypatch.setattr("server.experiment_sync.WRITE_DEADLINE_S", 1.0)
    with gateway_replica(backends, shared_url, {"ab": EVEN}) as gateway:
        with held_write_lock(shared_url):
            put = httpx.put(f"{gateway}/admin/experiments/ab", json=ALL_TWIN, headers=ADMIN, timeout=30)
            delete = httpx.delete(f"{gateway}/admin/experiments/ab", headers=ADMIN, timeout=30)
            created = httpx.put(f"{gateway}/admin/experiments/new", json=EVEN, headers=ADMIN, timeout=30)
            time.sleep(1.5)  # the lock outlives the answers, as in the probe (which then saw a commit)
        for refused in (put, delete, created):
            assert refused.status_code == 503, refused.text
            assert "rolled back" in refused.json()["error"]["message"]
        time.sleep(1.0)  # the lock is free: a write still waiting in a thread would commit now
        got = httpx.get(f"{gateway}/admin/experiments/ab", headers=ADMIN)
        assert got.headers["etag"] == '"1"' and got.json()["spec"]["arms"][0]["weight"] == 1
        history = httpx.get(f"{gateway}/admin/experiments/ab/history", headers=ADMIN).json()["changes"]
        assert [change["action"] for change in history] == ["seed"]
        assert httpx.put(f"{gateway}/admin/experiments/ab", json=ALL_TWIN, headers=ADMIN).status_code == 200
    with open_registry(shared_url) as registry:
        store = ExperimentStore(registry)
        assert store.versions() == {"ab": 2} and [c.version for c in store.history("ab")] == [1, 2]


def test_the_store_rolls_back_a_change_past_its_deadline(shared_url):
    with open_registry(shared_url) as registry:
        store = ExperimentStore(registry)
        store.set("ab", EVEN, actor="test")
        with held_write_lock(shared_url):
            with pytest.raises(WriteTimeout):
                store.set("ab", ALL_TWIN, actor="test", deadline_s=0.5)
            with pytest.raises(WriteTimeout):
                store.delete("ab", actor="test", deadline_s=0.5)
        assert store.set("other", EVEN, actor="test", deadline_s=5).version == 1  # the lock is free again
        assert store.versions() == {"ab": 1, "other": 1} and store.get("ab").spec == EVEN


# -- a replica that has never read its registry --------------------------------------------------------------
def sample(gateway: str) -> tuple[int, int, str | None]:
    """(``/ready`` status, status of a request for experiment ``ab``, its Retry-After)."""
    ready = httpx.get(f"{gateway}/ready").status_code
    answer = complete(gateway, "ab")
    return ready, answer.status_code, answer.headers.get("retry-after")


def test_a_replica_started_during_a_registry_outage_is_never_ready_while_it_cannot_route(backends, tmp_path):
    path = tmp_path / "registry.db"
    with open_registry(f"sqlite:///{tmp_path / 'elsewhere.db'}") as registry:
        ExperimentStore(registry).set("ab", ALL_TWIN, actor="test")
    path.mkdir()  # the registry's path cannot be opened: an outage from the start
    with gateway_replica(backends, f"sqlite:///{path}") as gateway:
        during = [sample(gateway) for _ in range(5)]
        assert set(during) == {(503, 503, "1")}  # not ready, and no 404 for an experiment it cannot see
        ready = httpx.get(f"{gateway}/ready").json()
        assert ready["reasons"] == ["the experiments have not been read from the registry yet"]
        assert complete(gateway, "dense").status_code == 200
        path.rmdir()
        (tmp_path / "elsewhere.db").rename(path)  # the registry is back
        wait_until(lambda: sample(gateway)[0] == 200, 10, "the replica to read the registry")
        after = [sample(gateway) for _ in range(5)]
        assert set(after) == {(200, 200, None)}
        assert complete(gateway, "ab").headers["x-depthprune-variant"] == "twin"


@pytest.mark.postgres
def test_postgres_outage_start_never_ready_while_404_and_out_of_sync_at_once(backends, postgres_admin_url):
    import psycopg

    name = f"faults_{uuid.uuid4().hex[:12]}"
    url = create_database_at(postgres_admin_url, name)

    def allow_connections(allow: bool) -> None:
        with psycopg.connect(libpq_dsn(postgres_admin_url), autocommit=True) as connection:
            connection.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {str(allow).lower()}')
            if not allow:
                connection.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,)
                )

    try:
        with open_registry(url) as registry:
            ExperimentStore(registry).set("ab", ALL_TWIN, actor="test")
        allow_connections(False)
        with gateway_replica(backends, url) as gateway:
            assert {sample(gateway) for _ in range(5)} == {(503, 503, "1")}
            allow_connections(True)
            wait_until(lambda: sample(gateway)[0] == 200, 10, "the replica to read the registry")
            assert {sample(gateway) for _ in range(3)} == {(200, 200, None)}
            allow_connections(False)  # a synced replica keeps routing on its last good copy
            wait_until(lambda: not httpx.get(f"{gateway}/ready").json()["experiments"]["in_sync"], 2)
            assert {sample(gateway) for _ in range(3)} == {(200, 200, None)}
    finally:
        allow_connections(True)
        drop_database_at(postgres_admin_url, name)


def test_a_sync_that_hangs_counts_as_failed_after_the_read_timeout_and_is_not_started_twice():
    from prometheus_client import CollectorRegistry

    from server.experiment_sync import SharedExperiments
    from server.experiments import Router

    calls = []

    class HangingStore:
        def versions(self):
            calls.append(time.monotonic())
            time.sleep(1.0)
            return {}

        def records(self, names, deleted=False):
            return []

    async def scenario():
        shared = SharedExperiments(Router({}), CollectorRegistry(), registry_url="sqlite:///unused.db")
        shared.store, shared.read_timeout_s = HangingStore(), 0.2
        await shared.sync()
        first = (shared.synced, shared.status()["in_sync"], shared.error)
        await shared.sync()  # the same read, still running: waited for, not started again
        while not shared.synced:
            await shared.sync()
        shared._executor.shutdown(wait=False)
        return first, shared.status()["in_sync"]

    (synced, in_sync, error), finally_in_sync = asyncio.run(scenario())
    assert (synced, in_sync) == (False, False) and "did not answer within 0.2 s" in error
    assert finally_in_sync and len(calls) == 1


# -- metric series follow the experiments -------------------------------------------------------------------
def test_the_series_of_a_removed_arm_or_experiment_are_removed(backends):
    two_arms = {"arms": [{"variant": "dense", "name": "a"}, {"variant": "twin", "name": "b"}]}
    with gateway_replica(backends, None) as gateway:
        httpx.put(f"{gateway}/admin/experiments/ab", json=two_arms, headers=ADMIN)
        for arm_name in ("a", "b"):
            forced = httpx.post(
                f"{gateway}/v1/completions",
                json={"model": "ab", "prompt": "w3"},
                headers={"x-depthprune-arm": arm_name},
            )
            assert forced.status_code == 200
        assert 'arm="b"' in httpx.get(f"{gateway}/metrics").text
        one_arm = {"arms": [{"variant": "dense", "name": "a"}]}
        assert httpx.put(f"{gateway}/admin/experiments/ab", json=one_arm, headers=ADMIN).status_code == 200
        metrics = httpx.get(f"{gateway}/metrics").text
        assert 'arm="b"' not in metrics and 'arm="a"' in metrics
        assert httpx.delete(f"{gateway}/admin/experiments/ab", headers=ADMIN).status_code == 200
        assert 'experiment="ab"' not in httpx.get(f"{gateway}/metrics").text


# -- no redirect built from the Host header -----------------------------------------------------------------
@pytest.mark.parametrize("path", ["/v1/models/", "/ready/", "/admin/experiments/", "/v1/completions/"])
def test_a_trailing_slash_is_a_404_not_a_redirect_to_the_host_header(backends, path):
    with gateway_replica(backends, None) as gateway:
        for method in ("GET", "POST"):
            response = httpx.request(method, f"{gateway}{path}", headers={"host": "evil.example"})
            assert response.status_code in (404, 405) and "location" not in response.headers


# -- property: what the admin API accepts is served and read back unchanged ---------------------------------
NAMES = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:+-]{0,24}", fullmatch=True)
WEIGHTS = st.one_of(st.integers(0, 1_000_000), st.floats(0, 1e6, allow_nan=False, allow_infinity=False))
ARMS = st.fixed_dictionaries(
    {"variant": st.sampled_from(["dense", "twin"])}, optional={"name": NAMES, "weight": WEIGHTS}
)
SPECS = st.fixed_dictionaries(  # mostly valid: arm names unique (a missing name is the variant's)
    {
        "arms": st.lists(
            ARMS, min_size=1, max_size=MAX_ARMS, unique_by=lambda arm: arm.get("name", arm["variant"])
        )
    },
    optional={"sticky": st.booleans()},
)
ANYTHING = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=30),
    st.lists(st.integers(), max_size=3),
)
LOOSE_ARMS = st.dictionaries(
    st.sampled_from(["variant", "objective", "name", "weight", "fallback", "extra"]),
    st.one_of(ANYTHING, st.sampled_from(["dense", "twin", "ppl"]), NAMES),
    max_size=4,
)
LOOSE_SPECS = st.dictionaries(
    st.sampled_from(["arms", "sticky", "fallback", "forcible"]),
    st.one_of(ANYTHING, st.lists(st.one_of(LOOSE_ARMS, ARMS), max_size=4)),
    max_size=4,
)
EXPERIMENT_NAMES = st.sampled_from(["ab", "x.y", "E-1", "c:d+e"])


def served_and_read_back(client, name: str, body, response) -> None:
    """A 200 must mean: GET gives back the spec as the check normalised it, and requests are served."""
    expected = parse_spec(name, body).model_dump(mode="json")
    got = client.get(f"/admin/experiments/{name}", headers=ADMIN)
    assert got.status_code == 200 and got.json()["spec"] == expected
    assert got.headers["etag"] == response.headers["etag"]
    history = client.get(f"/admin/experiments/{name}/history", headers=ADMIN).json()["changes"]
    assert history[-1]["new_spec"] == expected
    arms = {arm["name"] for arm in expected["arms"] if arm["weight"] > 0}
    for user in ("u1", "u2"):
        answer = client.post("/v1/completions", json={"model": name, "prompt": "w3", "user": user})
        assert answer.status_code == 200 and answer.headers["x-depthprune-arm"] in arms


def test_property_any_accepted_spec_is_served_and_read_back_unchanged(backends, sqlite_url):
    from starlette.testclient import TestClient

    from server import BackendSpec, GatewaySettings, create_app

    config = GatewaySettings(
        backends=[BackendSpec(name, url=url) for name, url in backends.items()],
        admin_token="admin-secret",
        experiments_registry=sqlite_url,
    )
    with TestClient(create_app(config)) as client:

        def accepted_means_served(name, body):
            # json.dumps as a Python client writes it: NaN and Infinity reach the gateway as their JSON
            # extensions, which it must refuse like any other bad value
            response = client.put(
                f"/admin/experiments/{quote(name)}",
                content=json.dumps(body),
                headers={**ADMIN, "content-type": "application/json"},
            )
            assert response.status_code in (200, 400), response.text
            if response.status_code == 200:
                served_and_read_back(client, name, body, response)
            elif "no arm serving the dense model" not in response.json()["error"]["message"]:
                with pytest.raises(ValueError):  # refused by the one check (not for lack of a control)
                    parse_spec(name, body)

        quick = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
        quick(given(name=EXPERIMENT_NAMES, body=SPECS)(accepted_means_served))()  # mostly accepted
        quick(given(name=EXPERIMENT_NAMES, body=LOOSE_SPECS)(accepted_means_served))()  # mostly refused
