"""The registry's Python API, run against SQLite and a real PostgreSQL server.

The ``registry_url`` fixture is parametrised over both backends. The PostgreSQL half starts a throwaway
cluster from the installed server binaries (or uses ``DEPTHPRUNE_TEST_POSTGRES_URL``, a URL of a server
where the tests may create databases); it is skipped only when neither exists and
``DEPTHPRUNE_REQUIRE_POSTGRES`` is unset, as in CI it is set and the tests fail instead.

    .venv/bin/python -m pytest tests/test_registry.py -q
"""

from __future__ import annotations

import math
import multiprocessing
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy import func, select

from depthprune.testing.postgres import (
    create_database_at,
    drop_database_at,
)
from ground.core.checksums import weights_sha256
from ground.core.errors import UserError
from registry import DENSE, VariantInfo, open_registry
from registry.records import VariantRecord
from registry.tables import AliasRow, EvaluationRow, ServingBenchmarkRow, VariantRow

BASE = "org/Tiny-Llama"
CALIBRATION = {"objective": "ppl", "data": "c4", "samples": 64, "seq_len": 2048, "seed": 0}


# ------------------------------------------------------------------------------ fixtures


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def registry_url(request, tmp_path):
    """A fresh, empty registry database on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'registry.db'}"
        return
    admin_url = request.getfixturevalue("postgres_admin_url")
    name = f"registry_test_{uuid.uuid4().hex[:12]}"
    url = create_database_at(admin_url, name)
    yield url
    drop_database_at(admin_url, name)


@pytest.fixture
def registry(registry_url):
    with open_registry(registry_url) as opened:
        yield opened


def register_base(registry, model: str = BASE, num_blocks: int = 8, **overrides):
    fields = dict(revision="main", weights_sha256="b" * 64, num_blocks=num_blocks, architecture="llama")
    fields.update(overrides)
    return registry.register_base_model(model, **fields)


def register(
    registry, removed=(1, 3), *, base: str = BASE, calibration=None, search: str = "greedy", **overrides
):
    fields = dict(
        base_model=base,
        removed_blocks=removed if isinstance(removed, str) else list(removed),
        calibration=dict(calibration or CALIBRATION),
        search=search,
        search_options={"width": 1},
        calibration_loss=3.5,
        dense_loss=3.0,
        search_seconds=12.0,
        block_forwards=400,
        subset_evaluations=20,
        checkpoint_path=None,
        checkpoint_sha256=None,
    )
    fields.update(overrides)
    return registry.register_variant(VariantRecord(**fields))


def count(registry, table) -> int:
    from sqlalchemy.orm import Session

    with Session(registry.engine) as session:
        return session.scalar(select(func.count()).select_from(table))


def fake_checkpoint(directory: Path, content: bytes = b"weights") -> Path:
    """A directory that looks like a pruned checkpoint to the checksum (no torch needed)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "model.safetensors").write_bytes(content)
    (directory / "pruning.json").write_text("{}")
    return directory


# ------------------------------------------------------------------------------ schema


def test_import_does_not_load_torch_vllm_or_the_database_layer():
    code = (
        "import sys, registry, registry.cli; "
        "print(sorted(m for m in ('torch', 'vllm', 'sqlalchemy') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_every_exported_name_resolves():
    import registry

    # The lazy import table and __all__ must name the same things, or one of them drifted.
    assert sorted(registry.__all__) == sorted(registry._EXPORTS)
    assert set(registry.__all__) <= set(dir(registry))
    for name in registry.__all__:
        getattr(registry, name)  # raises when the name moved or was renamed in its module
    with pytest.raises(AttributeError):
        registry.no_such_name  # noqa: B018


def test_head_revision_constant_matches_the_migrations():
    from registry.schema import HEAD_REVISION, head_revision

    assert head_revision() == HEAD_REVISION


def test_open_creates_the_schema_and_reopening_keeps_the_data(registry_url):
    from registry.schema import HEAD_REVISION, current_revision

    with open_registry(registry_url) as first:
        assert current_revision(first.engine) == HEAD_REVISION
        register_base(first)
    with open_registry(registry_url) as second:
        assert [base.model for base in second.base_models()] == [BASE]


def test_tables_match_the_migrations(registry):
    """The ORM models and the Alembic migrations describe the same schema."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from registry.tables import Base

    with registry.engine.connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert differences == []


def test_migrations_downgrade_and_upgrade_cleanly(registry_url):
    from alembic import command
    from sqlalchemy import inspect

    from registry.schema import alembic_config, current_revision

    with open_registry(registry_url) as opened:
        config = alembic_config()
        with opened.engine.begin() as connection:
            config.attributes["connection"] = connection
            command.downgrade(config, "base")
        assert set(inspect(opened.engine).get_table_names()) <= {"alembic_version"}
        assert current_revision(opened.engine) is None
    with open_registry(registry_url) as reopened:
        assert register_base(reopened).model == BASE


def test_a_schema_newer_than_this_code_is_one_clear_error(registry_url):
    from sqlalchemy import text

    with open_registry(registry_url) as opened, opened.engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    with pytest.raises(UserError, match="revision '9999', which this depthprune does not know"):
        open_registry(registry_url)


def test_a_sqlite_file_that_cannot_be_created_is_one_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UserError, match="cannot create the registry's directory"):
        open_registry(f"sqlite:///{blocker}/sub/registry.db")
    with pytest.raises(UserError, match="cannot connect to the registry"):
        open_registry(f"sqlite:///{tmp_path}")  # a directory, not a database file


def test_default_url_is_sqlite_under_the_data_directory(isolated_home):
    with open_registry() as opened:
        assert opened.url.startswith("sqlite:///")
    assert (isolated_home / "registry.db").is_file()


@pytest.mark.parametrize(
    "url, message",
    [
        ("not a url", "is not a database URL"),
        ("nosuchdb://host/db", "driver not available"),
        ("postgresql+psycopg://nobody:secret@127.0.0.1:1/none", "cannot connect to the registry"),
    ],
)
def test_a_url_that_does_not_connect_is_one_clear_error(url, message):
    with pytest.raises(UserError, match=message) as caught:
        open_registry(url)
    assert "\n" not in str(caught.value)
    assert "secret" not in str(caught.value)


# ------------------------------------------------------------------------------ base models


def test_register_base_model_is_idempotent(registry, tmp_path):
    first = register_base(registry)
    again = register_base(registry, weights_sha256="c" * 64, revision="v2")
    assert again.id == first.id
    assert (again.weights_sha256, again.revision) == ("c" * 64, "v2")
    assert len(registry.base_models()) == 1
    local = register_base(registry, str(tmp_path))
    assert local.model == str(tmp_path.resolve()) and local.path == str(tmp_path.resolve())
    assert registry.get_base_model("tiny-llama").model == BASE  # the short name works too


def test_register_base_model_rejects_bad_input(registry):
    with pytest.raises(UserError, match="num_blocks"):
        register_base(registry, num_blocks=1)
    with pytest.raises(UserError, match="weights_sha256"):
        register_base(registry, weights_sha256="")
    assert registry.base_models() == []


# ------------------------------------------------------------------------------ variants


def test_register_variant_records_everything(registry):
    register_base(registry)
    variant = register(registry, removed=(5, 1, 3))
    assert isinstance(variant, VariantInfo) and not variant.is_dense
    assert variant.removed_blocks == [1, 3, 5]
    assert variant.kept_to_original == [0, 2, 4, 6, 7]
    assert variant.objective == "ppl" and variant.calibration == CALIBRATION
    assert (variant.num_blocks, variant.architecture, variant.base_revision) == (8, "llama", "main")
    assert variant.base_weights_sha256 == "b" * 64
    assert variant.name.startswith("tiny-llama-ppl-greedy-m3-")
    assert variant.mask() == "■□■□■□■■"
    assert variant.versions["depthprune"] and variant.versions["python"]
    assert variant.created_at.tzinfo is not None
    assert registry.resolve(variant.name) == variant


def test_registering_the_same_configuration_again_updates_the_row(registry):
    register_base(registry)
    first = register(registry, removed=(1, 3), calibration_loss=3.5)
    again = register(registry, removed=(3, 1), calibration_loss=3.25, search_options={"width": 2})
    assert again.id == first.id and again.name == first.name
    assert again.calibration_loss == 3.25 and again.search_options == {"width": 2}
    assert again.created_at == first.created_at and again.updated_at >= first.updated_at
    assert count(registry, VariantRow) == 1
    # Any part of the identity that differs makes a new variant.
    register(registry, removed=(1, 4))
    register(registry, calibration={**CALIBRATION, "seed": 1})
    register(registry, calibration={**CALIBRATION, "objective": "task_margin"})
    register(registry, search="beam")
    assert count(registry, VariantRow) == 5


def test_an_update_without_a_checkpoint_keeps_the_recorded_one(registry, tmp_path):
    register_base(registry)
    with_checkpoint = register(registry, checkpoint_path=str(tmp_path), checkpoint_sha256="d" * 64)
    again = register(registry)
    assert (again.checkpoint_path, again.checkpoint_sha256) == (str(tmp_path.resolve()), "d" * 64)
    assert again.id == with_checkpoint.id


def test_names_given_are_checked_and_unique(registry):
    register_base(registry)
    named = register(registry, name="llama-ppl-m2")
    assert registry.resolve("llama-ppl-m2").id == named.id
    with pytest.raises(UserError, match="taken by another variant"):
        register(registry, removed=(2, 4), name="llama-ppl-m2")
    for bad in ("dense", "123", "has space", "a/b", "x@y", "", "name\n"):
        with pytest.raises(UserError):
            register(registry, removed=(2, 5), name=bad)
    assert count(registry, VariantRow) == 1
    renamed = register(registry, name="renamed")  # the same configuration: the row is renamed
    assert renamed.id == named.id and renamed.name == "renamed"


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"base": "org/Unknown"}, "not registered"),
        ({"removed": (1, 8)}, "out of range"),
        ({"removed": (1, 1)}, "more than once"),
        ({"removed": ()}, "between 1 and 7"),
        ({"removed": range(8)}, "between 1 and 7"),
        ({"removed": "1,3"}, "list of block indices"),
        ({"calibration": {"data": "c4"}}, "objective"),
        ({"calibration": {"objective": "ppl", "fn": object()}}, "cannot be stored"),
        ({"calibration_loss": "low"}, "must be a number"),
        ({"block_forwards": -1}, "non-negative"),
        ({"search": " "}, "search"),
    ],
)
def test_bad_variants_are_refused_and_nothing_is_written(registry, overrides, message):
    register_base(registry)
    with pytest.raises(UserError, match=message):
        register(registry, **overrides)
    assert count(registry, VariantRow) == 0


def test_a_variant_record_is_plain_json_and_reads_back_equal(tmp_path):
    import json
    from dataclasses import asdict

    np = pytest.importorskip("numpy")
    record = VariantRecord(
        base_model=f" {BASE} ",
        removed_blocks=np.array([5, 1]),
        calibration=CALIBRATION,
        search="greedy",
        search_options={"seed": np.int64(3)},
        calibration_loss=np.float32(2.5),
        dense_loss=float("nan"),
        checkpoint_path=str(tmp_path / "variant" / ".."),
    )
    assert (record.base_model, record.removed_blocks, record.objective) == (BASE, [1, 5], "ppl")
    assert record.calibration_loss == 2.5 and record.dense_loss is None
    assert record.search_options == {"seed": 3} and record.checkpoint_path == str(tmp_path.resolve())
    assert VariantRecord(**json.loads(json.dumps(asdict(record)))) == record


def test_numpy_values_and_nan_losses_are_stored_as_plain_values(registry):
    np = pytest.importorskip("numpy")
    register_base(registry)
    variant = register(
        registry,
        removed=np.array([2, 6]),
        calibration_loss=np.float32(2.5),
        dense_loss=float("nan"),
        block_forwards=np.int64(7),
        search_options={"mutation": np.float64(0.15), "inf": math.inf},
    )
    assert variant.removed_blocks == [2, 6] and variant.calibration_loss == 2.5
    assert variant.dense_loss is None and variant.block_forwards == 7
    assert variant.search_options == {"mutation": 0.15, "inf": None}


# ------------------------------------------------------------------------------ resolve, aliases


def test_resolve_by_id_name_alias_and_dense(registry, tmp_path):
    register_base(registry, path=str(tmp_path))
    variant = register(registry)
    assert registry.resolve(variant.id).name == variant.name
    assert registry.resolve(str(variant.id)).name == variant.name
    registry.set_alias("ppl-best", variant.name)
    resolved = registry.resolve("ppl-best")
    assert resolved.id == variant.id and resolved.aliases == ["ppl-best"]
    dense = registry.resolve(DENSE)
    assert dense.is_dense and dense.id is None and dense.removed_blocks == []
    assert dense.kept_to_original == list(range(8)) and dense.checkpoint_path == str(tmp_path.resolve())
    assert registry.resolve(BASE).is_dense
    assert registry.resolve(f"{variant.name}@tiny-llama").id == variant.id
    assert registry.resolve(dense).is_dense
    for unknown in ("nope", 999, "999", "", None):
        with pytest.raises(UserError):
            registry.resolve(unknown)


def test_dense_of_a_hub_model_is_its_hub_id(registry):
    register_base(registry)
    assert registry.resolve("dense").checkpoint_path == BASE


def test_aliases_move_point_at_dense_and_are_per_base_model(registry):
    register_base(registry)
    register_base(registry, "org/Other", num_blocks=6)
    first = register(registry, removed=(1, 3))
    second = register(registry, removed=(2, 4))
    other = register(registry, removed=(0, 1), base="org/Other")
    registry.set_alias("ppl-best", first.name)
    registry.set_alias("ppl-best", second.name)  # moves within the base model
    assert registry.resolve("ppl-best").id == second.id
    assert registry.resolve(first.name).aliases == []
    registry.set_alias("ppl-best", other.name)  # the same alias for another base model
    with pytest.raises(UserError, match="ambiguous"):
        registry.resolve("ppl-best")
    assert registry.resolve(f"ppl-best@{BASE}").id == second.id
    assert registry.resolve("ppl-best@other").id == other.id
    with pytest.raises(UserError, match="ambiguous"):
        registry.resolve(DENSE)
    assert registry.resolve("dense@org/Other").num_blocks == 6
    registry.set_alias("control", f"dense@{BASE}")
    assert registry.resolve("control").is_dense
    assert registry.aliases() == {
        f"control@{BASE}": "dense",
        f"ppl-best@{BASE}": second.name,
        "ppl-best@org/Other": other.name,
    }
    with pytest.raises(UserError, match="already the name of variant"):
        registry.set_alias(first.name, second.name)
    with pytest.raises(UserError, match="reserved"):
        registry.set_alias("dense", first.name)
    with pytest.raises(UserError, match="ambiguous"):
        registry.remove_alias("ppl-best")
    registry.remove_alias("ppl-best@other")
    assert registry.resolve("ppl-best").id == second.id
    with pytest.raises(UserError, match="no alias"):
        registry.remove_alias("nope")


def test_list_variants_filters_by_base_and_includes_dense_on_request(registry):
    register_base(registry)
    register_base(registry, "org/Other", num_blocks=6)
    mine = [register(registry, removed=(1, 3)).name, register(registry, removed=(2, 3)).name]
    register(registry, removed=(0, 1), base="org/Other")
    assert [variant.name for variant in registry.list_variants(BASE)] == mine
    assert len(registry.list_variants()) == 3
    with_dense = registry.list_variants(BASE, include_dense=True)
    assert with_dense[0].is_dense and [variant.name for variant in with_dense[1:]] == mine
    with pytest.raises(UserError, match="not registered"):
        registry.list_variants("org/Unknown")


# ------------------------------------------------------------------------------ evaluations


def test_evaluations_are_replaced_per_task_metric_and_settings(registry):
    register_base(registry)
    variant = register(registry)
    registry.add_evaluation(
        variant.name,
        suite="ppl",
        task="wikitext2",
        metric="perplexity",
        value=20.0,
        settings={"seq_len": 2048},
    )
    registry.add_evaluation(
        variant.id, suite="ppl", task="wikitext2", metric="perplexity", value=19.5, settings={"seq_len": 2048}
    )
    registry.add_evaluation(
        variant, suite="ppl", task="wikitext2", metric="perplexity", value=25.0, settings={"seq_len": 512}
    )
    registry.add_evaluation(variant, suite="lm-eval", task="piqa", metric="acc", value=0.7, settings={})
    found = registry.evaluations(variant.name)
    assert [(item.suite, item.task, item.value) for item in found] == [
        ("lm-eval", "piqa", 0.7),
        ("ppl", "wikitext2", 19.5),
        ("ppl", "wikitext2", 25.0),
    ]
    assert found[0].variant == variant.name and found[0].versions


def test_the_dense_model_has_its_own_evaluations(registry):
    register_base(registry)
    variant = register(registry)
    registry.add_evaluation("dense", suite="ppl", task="c4", metric="perplexity", value=math.inf, settings={})
    registry.add_evaluation(variant, suite="ppl", task="c4", metric="perplexity", value=30.0, settings={})
    dense = registry.evaluations(DENSE)
    assert [(item.variant, item.variant_id, item.value) for item in dense] == [("dense", None, math.inf)]
    assert [item.value for item in registry.evaluations(variant)] == [30.0]


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"value": float("nan")}, "NaN"),
        ({"value": "high"}, "must be a number"),
        ({"suite": ""}, "suite"),
        ({"settings": ["not", "a", "dict"]}, "must be a dict"),
    ],
)
def test_bad_evaluations_are_refused(registry, fields, message):
    register_base(registry)
    variant = register(registry)
    arguments = dict(suite="ppl", task="c4", metric="perplexity", value=1.0, settings={})
    arguments.update(fields)
    with pytest.raises(UserError, match=message):
        registry.add_evaluation(variant, **arguments)
    with pytest.raises(UserError, match="no variant"):
        registry.add_evaluation(
            "unknown", suite="ppl", task="c4", metric="perplexity", value=1.0, settings={}
        )
    assert count(registry, EvaluationRow) == 0


# ------------------------------------------------------------------------------ serving benchmarks


def test_serving_benchmarks_accumulate_newest_first_with_scalar_metrics(registry):
    register_base(registry)
    variant = register(registry)
    for rate in (1.0, 4.0):
        registry.add_serving_benchmark(
            variant.name,
            settings={"request_rate": rate, "num_prompts": 32},
            metrics={"median_ttft_ms": 10 * rate, "output_throughput": 100.0, "ttfts": [0.1, 0.2]},
            hardware="2-core CPU",
        )
    registry.add_serving_benchmark("dense", settings={}, metrics={"median_ttft_ms": 50.0}, hardware="cpu")
    runs = registry.serving_benchmarks(variant)
    assert [run.settings["request_rate"] for run in runs] == [4.0, 1.0]
    assert runs[0].metrics == {"median_ttft_ms": 40.0, "output_throughput": 100.0}
    assert [run.metrics["median_ttft_ms"] for run in registry.serving_benchmarks("dense")] == [50.0]
    with pytest.raises(UserError, match="empty"):
        registry.add_serving_benchmark(variant, settings={}, metrics={}, hardware="cpu")
    with pytest.raises(UserError, match="hardware"):
        registry.add_serving_benchmark(variant, settings={}, metrics={"a": 1}, hardware="")


# ------------------------------------------------------------------------------ remove


def test_remove_variant_takes_its_aliases_evaluations_and_benchmarks(registry, tmp_path):
    register_base(registry)
    checkpoint = fake_checkpoint(tmp_path / "variant")
    doomed = register(registry, checkpoint_path=str(checkpoint), checkpoint_sha256=weights_sha256(checkpoint))
    kept = register(registry, removed=(2, 4))
    for variant in (doomed, kept):
        registry.add_evaluation(variant, suite="ppl", task="c4", metric="perplexity", value=3.0, settings={})
        registry.add_serving_benchmark(variant, settings={}, metrics={"median_ttft_ms": 1.0}, hardware="cpu")
    registry.set_alias("ppl-best", doomed.name)
    with pytest.raises(UserError, match="is an alias"):
        registry.remove_variant("ppl-best")
    with pytest.raises(UserError, match="dense base model"):
        registry.remove_variant("dense")
    removed = registry.remove_variant(doomed.name, delete_checkpoint=True)
    assert removed.id == doomed.id and not checkpoint.exists()
    assert [variant.id for variant in registry.list_variants()] == [kept.id]
    assert count(registry, AliasRow) == 0
    assert count(registry, EvaluationRow) == 1 and count(registry, ServingBenchmarkRow) == 1
    with pytest.raises(UserError, match="no variant or alias"):
        registry.resolve("ppl-best")


def test_remove_never_deletes_a_directory_that_is_not_a_pruned_checkpoint(registry, tmp_path):
    register_base(registry)
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "model.safetensors").write_bytes(b"x")
    variant = register(registry, checkpoint_path=str(plain), checkpoint_sha256=weights_sha256(plain))
    registry.remove_variant(variant.name, delete_checkpoint=True)
    assert plain.is_dir()


# ------------------------------------------------------------------------------ checkpoints


def test_verify_checkpoint_refuses_modified_missing_and_unverifiable_weights(registry, tmp_path):
    dense_dir = fake_checkpoint(tmp_path / "dense", b"dense weights")
    register_base(registry, str(dense_dir), weights_sha256=weights_sha256(dense_dir))
    checkpoint = fake_checkpoint(tmp_path / "variant")
    variant = register(
        registry,
        base=str(dense_dir),
        checkpoint_path=str(checkpoint),
        checkpoint_sha256=weights_sha256(checkpoint),
    )
    registry.verify_checkpoint(variant)
    registry.verify_checkpoint(variant.name)
    registry.verify_checkpoint("dense")
    (checkpoint / "model.safetensors").write_bytes(b"tampered")
    with pytest.raises(UserError, match="was modified"):
        registry.verify_checkpoint(variant.name)
    (dense_dir / "model.safetensors").write_bytes(b"retrained")
    with pytest.raises(UserError, match="was modified"):
        registry.verify_checkpoint("dense")
    without = register(registry, base=str(dense_dir), removed=(2, 4))
    with pytest.raises(UserError, match="has no checkpoint"):
        registry.verify_checkpoint(without)
    missing = register(
        registry,
        base=str(dense_dir),
        removed=(2, 5),
        checkpoint_path=str(tmp_path / "gone"),
        checkpoint_sha256="e" * 64,
    )
    with pytest.raises(UserError, match="is missing"):
        registry.verify_checkpoint(missing)
    unverifiable = register(registry, base=str(dense_dir), removed=(2, 6), checkpoint_path=str(checkpoint))
    with pytest.raises(UserError, match="no recorded sha256"):
        registry.verify_checkpoint(unverifiable)


# ------------------------------------------------------------------------------ concurrency


def _register_from_another_process(url: str, worker: int, per_worker: int) -> list[str]:
    """Open the registry (the first opener creates the schema) and register ``per_worker`` variants."""
    names = []
    with open_registry(url) as registry:
        register_base(registry, num_blocks=16)
        for index in range(per_worker):
            calibration = {**CALIBRATION, "seed": worker * 1000 + index}
            variant = register(
                registry, removed=(worker % 16, (worker + index + 1) % 16), calibration=calibration
            )
            registry.add_evaluation(
                variant, suite="ppl", task="c4", metric="perplexity", value=float(index), settings={}
            )
            # Everyone also re-registers one shared configuration: it must stay a single row.
            register(
                registry, removed=(0, 1), calibration={**CALIBRATION, "seed": -1}, calibration_loss=worker
            )
            names.append(variant.name)
    return names


@pytest.mark.slow
def test_several_processes_registering_at_once_all_succeed_and_nothing_is_lost(registry_url):
    workers, per_worker = 6, 8
    context = multiprocessing.get_context("fork")
    with context.Pool(workers) as pool:
        results = pool.starmap(
            _register_from_another_process, [(registry_url, worker, per_worker) for worker in range(workers)]
        )
    with open_registry(registry_url) as registry:
        stored = {variant.name for variant in registry.list_variants()}
        assert len(registry.base_models()) == 1
        assert count(registry, EvaluationRow) == workers * per_worker
    expected = {name for names in results for name in names}
    assert len(expected) == workers * per_worker
    assert expected <= stored
    assert len(stored) == workers * per_worker + 1  # plus the shared configuration, once


def test_a_transient_lock_while_opening_a_sqlite_registry_is_retried(tmp_path, monkeypatch):
    """Two processes opening one new SQLite file at once: the loser saw "database is locked" at open (two
    `prune` runs started together) and stopped; a lock at open is transient and is waited out."""
    import sqlite3

    from sqlalchemy.exc import OperationalError

    import registry.database as database

    real_check = database.check_sqlite_integrity
    failures = []

    def locked_once(connection, name):
        if not failures:
            failures.append(name)
            raise OperationalError("PRAGMA quick_check", {}, sqlite3.OperationalError("database is locked"))
        return real_check(connection, name)

    monkeypatch.setattr(database, "check_sqlite_integrity", locked_once)
    with open_registry(f"sqlite:///{tmp_path / 'registry.db'}") as registry:
        assert registry.list_variants() == []
    assert len(failures) == 1


def test_variant_info_types_the_record_fields_as_the_record_does():
    """The choice and measurement fields are named once (registry.records) and typed alike in both records."""
    import dataclasses

    from registry.records import CHOICE_FIELDS, MEASUREMENT_FIELDS, VariantInfo, VariantRecord

    record = {item.name: item.type for item in dataclasses.fields(VariantRecord)}
    info = {item.name: item.type for item in dataclasses.fields(VariantInfo)}
    for name in (*CHOICE_FIELDS, *MEASUREMENT_FIELDS):
        assert record[name] == info[name], name
