"""Running the study: ``depthprune study`` from plan to report (:func:`run_study`).

1. :func:`pruning.study.plan.plan_study` expands and checks the grid before any weights are loaded;
2. each cell is taken from the study's manifest or from the registry when an earlier run already produced
   it — a cell done is never recomputed — and the missing ones are pruned (:mod:`pruning.study.cells`);
3. every variant (and the dense model) is evaluated unless the registry already holds those numbers;
4. with ``--heal lora:STEPS``, every distinct mask is healed and evaluated (:mod:`pruning.study.healing`);
5. :func:`pruning.study.report.write_report` writes the tables and figures.

Scaling out: ``--worker`` runs the same grid as one of several workers (on one machine or many) that share
the registry as a work queue; see :mod:`pruning.study.worker`.
"""

from __future__ import annotations

from pathlib import Path

from pruning.study.calibration_items import fill_calibration_items
from pruning.study.cells import (
    CellResult,
    fill_reused,
    find_in_registry,
    load_manifest,
    prune_missing,
    save_manifest,
)
from pruning.study.evaluation import evaluate_all
from pruning.study.healing import heal_study
from pruning.study.paths import resolved_path
from pruning.study.plan import StudyConfig, cell_options, plan_study, plan_summary
from pruning.study.report import write_report
from pruning.study.worker import run_worker


def run_study(config: StudyConfig) -> Path:
    """Run (or resume) the study and write its report.

    Returns:
        The report directory.
    """
    from pruning.runtime.engine_choice import resolve_engine
    from registry import open_registry

    if config.worker:
        return run_worker(config)
    plan = plan_study(config)
    registry = open_registry(config.registry_url)
    manifest = load_manifest(config.out)
    done: dict[str, CellResult] = {}
    dense: dict[str, float] = {}
    judged_by_mask = resolve_engine(config.engine) == "torch" and not config.heal
    for cell in (cell for cell in plan.cells if cell.reused_from is None):  # reused ones: fill_reused
        recorded = manifest.get(cell.key)
        # the torch engine judges a cell from its mask and the dense weights: its checkpoint may be gone
        checkpoint = resolved_path(recorded.checkpoint) if recorded else None
        kept = judged_by_mask or Path(checkpoint or "").is_dir()
        if recorded and recorded.matches(cell) and kept:
            done[cell.key] = manifest[cell.key]
        else:
            found = find_in_registry(registry, plan.model, cell, cell_options(config, plan.num_blocks, cell))
            if found is not None:
                done[cell.key] = found

    def save(dense_metrics: dict[str, float] | None = None) -> None:
        if dense_metrics is not None:
            dense.update(dense_metrics)
        save_manifest(config.out, plan, done, dense)

    running = [cell for cell in plan.cells if cell.reused_from is None]
    missing = [cell for cell in running if cell.key not in done]
    if config.progress:
        reused = len(plan.cells) - len(running)
        print(
            f"study: {len(plan.cells)} cells, {len(running) - len(missing)} already done, "
            f"{len(missing)} to run"
            + (f", {reused} reused from the first seed (pinned draw)" if reused else ""),
            flush=True,
        )
    save()
    if missing:
        prune_missing(plan, missing, done, save)
    fill_reused(plan, done)
    fill_calibration_items(plan, done)
    dense.update(evaluate_all(plan, done, registry, save))
    save()
    healing = None
    if config.heal:
        healing = heal_study(plan, done, registry)
    cells = [done[cell.key] for cell in plan.cells]
    write_report(config.out, plan_summary(plan), cells, dense, healing=healing)
    return config.out
