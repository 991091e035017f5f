"""The study grid on a Ray cluster: ``depthprune study --executor ray [--ray-address ADDR]``.

Each cell is one Ray task (prune one search's cell, evaluate its variant: :class:`GridCellRunner`, the same
code a ``--worker`` runs), then one task evaluates the dense model. A task asks Ray for the GPUs the memory
plan gives a cell (``gpus_per_cell``; Ray's GPU resources are logical, so the plan is what keeps two cells
from sharing a card they do not fit on together) and gets its ``CUDA_VISIBLE_DEVICES`` from Ray. Ray retries
a task whose node or worker process died; an exception, an out-of-memory included, is final (retrying it on
the same card fails the same way). Results go to the registry (use a PostgreSQL ``--registry`` when the
cluster has several machines); the driver writes the report, whose ``study.json`` says
``"executor": "ray"`` and records for every cell the ``host``, ``pid`` and ``ray_node_id`` it ran on.

Ray is an optional extra: ``pip install 'depthprune[ray]'``.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from ground.core.errors import UserError

NODE_LOSS_RETRIES = 3
"""Times Ray runs a cell again whose node or worker process died (not when the cell raised)."""


def _run_cell(config, cell_key: str) -> dict:
    """One cell inside a Ray task: its variant's registry id and where it ran."""
    import ray

    from pruning.runtime.isolation import OutOfMemory, is_out_of_memory, out_of_memory_message
    from pruning.study.plan import plan_study
    from pruning.study.worker import GridCellRunner
    from registry import open_registry

    plan = plan_study(config)
    try:
        variant_id = GridCellRunner(plan, open_registry(config.registry_url))(cell_key)
    except Exception as error:
        if is_out_of_memory(error):
            raise OutOfMemory(out_of_memory_message(error)) from None
        raise
    return {
        "cell": cell_key,
        "variant_id": variant_id,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "ray_node_id": ray.get_runtime_context().get_node_id(),
    }


def _gather(ray, references: dict) -> tuple[dict[str, dict], dict[str, str]]:
    """Each task's result, or its error in one line, by cell key."""
    results, failures = {}, {}
    for key, reference in references.items():
        try:
            results[key] = ray.get(reference)
        except Exception as error:  # noqa: BLE001 - a RayTaskError wraps the cell's own exception
            cause = getattr(error, "cause", None) or error
            failures[key] = f"{type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}"
    return results, failures


def run_on_ray(config, address: str | None = None, gpus_per_cell: float = 0.0) -> Path:
    """Run (or resume) the study of ``config`` with one Ray task per cell; write the report.

    Args:
        config: the study (a :class:`pruning.study.plan.StudyConfig`).
        address: a running cluster (``HOST:PORT`` or ``ray://...``); None starts a local one.
        gpus_per_cell: GPUs each task asks Ray for (from the memory plan; 0 on CPU).

    Returns:
        The report directory.

    Raises:
        UserError: Ray is not installed, or cells failed (the report is written once every cell is done).
    """
    try:
        import ray
    except ImportError:
        raise UserError("--executor ray needs Ray: pip install 'depthprune[ray]'") from None
    from pruning.study.cells import fill_reused, result_of_variant
    from pruning.study.plan import plan_study
    from pruning.study.worker import DENSE_CELL, write_worker_report
    from registry import open_registry

    plan = plan_study(config)  # every check before the cluster is touched
    registry = open_registry(config.registry_url)
    # The tasks see this driver's DEPTHPRUNE_* settings (home, registry URL), not the raylet's.
    environment = {name: value for name, value in os.environ.items() if name.startswith("DEPTHPRUNE_")}
    local = {} if address else {"include_dashboard": False, "num_cpus": os.cpu_count()}
    ray.init(
        address=address,
        ignore_reinit_error=True,
        log_to_driver=False,
        runtime_env={"env_vars": environment},
        **local,
    )
    task = ray.remote(
        num_cpus=1, num_gpus=gpus_per_cell, max_retries=NODE_LOSS_RETRIES, retry_exceptions=False
    )(_run_cell)
    # Pruned cells first: the first one registers the dense model the dense cell evaluates.
    # A cell reused from the first seed (a pinned draw, a deterministic search) is copied, not run.
    running = [cell for cell in plan.cells if cell.reused_from is None]
    results, failures = _gather(ray, {cell.key: task.remote(config, cell.key) for cell in running})
    if not failures:
        dense, dense_failures = _gather(ray, {DENSE_CELL: task.remote(config, DENSE_CELL)})
        results.update(dense)
        failures.update(dense_failures)
    if failures:
        shown = "; ".join(f"{key}: {error}" for key, error in list(failures.items())[:5])
        raise UserError(
            f"{len(failures)} study cell(s) failed on Ray ({shown}); run the command again to retry"
        )
    done = {
        cell.key: result_of_variant(cell, registry.resolve(results[cell.key]["variant_id"]))
        for cell in running
    }
    fill_reused(plan, done)
    out = write_worker_report(plan, registry, done)
    _record_placement(out, results)
    return out


def _record_placement(out: Path, results: dict[str, dict]) -> None:
    """``"executor": "ray"`` and each cell's host, pid and Ray node in ``study.json``."""
    path = out / "study.json"
    study = json.loads(path.read_text())
    study["executor"] = "ray"
    for cell in study.get("cells", []):
        placement = results.get(cell.get("key"), {})
        cell.update({name: placement.get(name) for name in ("host", "pid", "ray_node_id")})
    study["dense_evaluation"] = {
        name: results.get("dense", {}).get(name) for name in ("host", "pid", "ray_node_id")
    }
    path.write_text(json.dumps(study, indent=1))
