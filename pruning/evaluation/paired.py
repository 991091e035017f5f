"""A model against the baseline on the same items: paired differences, intervals, verdicts, retention.

The first model named is the baseline (dense by convention). For every other model and every result both
have (same suite, task and metric), the per-item scores of :mod:`pruning.evaluation.item_scores` are matched
by item key — so two results pair whether they were measured in one run or in two — and:

* **accuracy**: ``accuracy_delta`` = model − baseline, its 95 % interval by a *paired* percentile bootstrap
  over items (Koehn 2004: each resample draws the same items for both models; ``scipy.stats.bootstrap``
  with ``paired=True``, :data:`~pruning.evaluation.intervals.RESAMPLES` resamples, seed
  :data:`~pruning.evaluation.intervals.SEED`), and McNemar's exact p-value on the discordant items
  (``scipy.stats.binomtest``) beside it;
* **perplexity**: ``perplexity_ratio`` = model / baseline, its interval by the same paired bootstrap over
  windows, each resample recomputing both ``exp(Σ NLL / Σ tokens)`` over the drawn windows;
* **retention** (% of baseline): ``100 x model / baseline`` accuracy, or ``100 x baseline / model``
  perplexity, from the same resamples (never from two unpaired means);
* **verdict**: ``no measurable change`` when the interval of the difference holds 0 (of the ratio, 1),
  else ``better`` or ``worse`` — the load test's wording (:mod:`loadtest.intervals`).

Pairing is refused, with the reason in ``verdict`` (``not paired: ...``), when the items differ.

:func:`paired_comparison` returns the whole comparison of a list of models as data (the JSON of
``depthprune eval --json``); :func:`recorded_comparison` builds it from what the registry recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pruning.evaluation.intervals import RESAMPLES, SEED, bootstrap_percentile
from pruning.evaluation.item_scores import summary

NO_CHANGE = "no measurable change"
PAIRED_BOOTSTRAP = (
    f"paired percentile bootstrap over the same items (Koehn 2004; scipy.stats.bootstrap paired=True, "
    f"{RESAMPLES} resamples, seed {SEED})"
)


class PairingRefused(Exception):
    """Two results cannot be paired (their items differ); the message says how."""


@dataclass
class ComparedModel:
    """One model of a comparison: its label and results (a registry name, ``dense``, a directory)."""

    label: str
    """What the user named."""
    results: list
    """Its :class:`~pruning.evaluation.suites.EvalResult` list."""


def aligned(baseline_items: dict, model_items: dict) -> list[int]:
    """For each baseline item in order, the index of the same item in the model's scores.

    Raises:
        PairingRefused: the two hold different items.
    """
    base_keys, model_keys = baseline_items["keys"], model_items["keys"]
    where = {key: index for index, key in enumerate(model_keys)}
    shared = sum(1 for key in base_keys if key in where)
    if shared != len(base_keys) or len(model_keys) != len(base_keys):
        raise PairingRefused(
            f"items differ ({len(base_keys)} in the baseline, {len(model_keys)} in the model, "
            f"{shared} shared)"
        )
    return [where[key] for key in base_keys]


def verdict(low: float, high: float, neutral: float, higher_is_better: bool) -> str:
    """``no measurable change`` when ``[low, high]`` holds ``neutral``, else ``better`` or ``worse``."""
    if low <= neutral <= high:
        return NO_CHANGE
    return "better" if (low > neutral) == higher_is_better else "worse"


def paired_accuracy(baseline: Sequence[int], model: Sequence[int]) -> dict:
    """Accuracy difference, retention, their paired intervals, McNemar's p and the verdict (same item order).

    Args:
        baseline: the baseline's 0/1 per item.
        model: the model's 0/1 on the same items, in the same order.
    """
    import numpy as np
    from scipy import stats

    base, other = np.asarray(baseline, dtype=float), np.asarray(model, dtype=float)
    delta = float(other.mean() - base.mean())
    retention = 100 * float(other.mean() / base.mean()) if base.mean() > 0 else None

    def statistic(b, m, axis=-1):
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.stack([m.mean(axis) - b.mean(axis), 100 * m.mean(axis) / b.mean(axis)])

    point = np.array([delta, np.nan if retention is None else retention])
    low, high = bootstrap_percentile((base, other), statistic, point)
    gained, lost = int(((other == 1) & (base == 0)).sum()), int(((other == 0) & (base == 1)).sum())
    mcnemar = stats.binomtest(gained, gained + lost).pvalue if gained + lost else 1.0
    record = {
        "accuracy_delta": delta,
        "accuracy_delta_ci95": [float(low[0]), float(high[0])],
        "verdict": verdict(float(low[0]), float(high[0]), 0.0, higher_is_better=True),
        "retention": retention,
        "retention_ci95": None if retention is None else [float(low[1]), float(high[1])],
        "items_gained": gained,
        "items_lost": lost,
        "mcnemar_p": float(mcnemar),
    }
    return record


def paired_perplexity(baseline: tuple[list, list], model: tuple[list, list]) -> dict:
    """Perplexity ratio (model / baseline), retention, paired intervals and verdict (same window order).

    Args:
        baseline: the baseline's ``(nll, tokens)`` per window.
        model: the model's ``(nll, tokens)`` on the same windows, in the same order.
    """
    import numpy as np

    arrays = tuple(np.asarray(values, dtype=float) for values in (*baseline, *model))

    def statistic(base_nll, base_tokens, nll, tokens, axis=-1):
        log_ratio = nll.sum(axis) / tokens.sum(axis) - base_nll.sum(axis) / base_tokens.sum(axis)
        ratio = np.exp(np.clip(log_ratio, -700.0, 700.0))
        return np.stack([ratio, 100 / ratio])

    point = statistic(*(array[None, :] for array in arrays))[:, 0]
    low, high = bootstrap_percentile(arrays, statistic, point)
    return {
        "perplexity_ratio": float(point[0]),
        "perplexity_ratio_ci95": [float(low[0]), float(high[0])],
        "verdict": verdict(float(low[0]), float(high[0]), 1.0, higher_is_better=False),
        "retention": float(point[1]),
        "retention_ci95": [float(low[1]), float(high[1])],
    }


AGAINST_PARENT = "against_parent"
"""Where a repaired child's results hold their comparison with the parent's (:func:`add_gap_recovered`)."""


def windows_in_order(items: dict, order: Sequence[int]) -> tuple[list, list]:
    """``(nll, tokens)`` of a perplexity result's windows in the order ``order`` gives (:func:`aligned`)."""
    return [items["nll"][index] for index in order], [items["tokens"][index] for index in order]


def _log_perplexities(*arrays, axis=-1) -> list:
    """Per model, ``sum NLL / sum tokens`` of its ``(nll, tokens)`` arrays, given one pair after another."""
    return [nll.sum(axis) / tokens.sum(axis) for nll, tokens in zip(arrays[::2], arrays[1::2], strict=True)]


def gap_recovered(dense: tuple[list, list], parent: tuple[list, list], child: tuple[list, list]) -> dict:
    """How much of its parent's perplexity gap to dense a repaired child closes, paired over the same windows.

    ``(log ppl(parent) - log ppl(child)) / (log ppl(parent) - log ppl(dense))``: 1 = back to dense, 0 = no
    repair, negative = worse than the parent. Each bootstrap resample draws the same windows for all three
    models (:data:`PAIRED_BOOTSTRAP`), so the interval holds the repair's effect, not the windows' spread.

    Args:
        dense, parent, child: each model's ``(nll, tokens)`` per window, in the same window order.

    Returns:
        ``gap_recovered``, ``gap_recovered_ci95`` and the method; None (with the interval) when the parent
        is no worse than dense on these windows (there is no gap to recover).
    """
    import numpy as np

    arrays = tuple(np.asarray(values, dtype=float) for values in (*dense, *parent, *child))

    def statistic(*resampled, axis=-1):
        log_dense, log_parent, log_child = _log_perplexities(*resampled, axis=axis)
        return (log_parent - log_child) / (log_parent - log_dense)

    log_dense, log_parent, _ = _log_perplexities(*arrays)
    if not log_parent > log_dense:
        return {"gap_recovered": None, "gap_recovered_ci95": None, "gap_method": PAIRED_BOOTSTRAP}
    point = float(statistic(*arrays))
    low, high = bootstrap_percentile(arrays, statistic, point)
    return {"gap_recovered": point, "gap_recovered_ci95": [low, high], "gap_method": PAIRED_BOOTSTRAP}


def add_gap_recovered(baseline_results: Sequence, parent_results: Sequence, results: Sequence) -> None:
    """Write :func:`gap_recovered` into each perplexity result's ``statistics["paired"]`` of a repaired child,
    against the baseline (dense) and its parent's same result; results that do not pair are left alone. Every
    result of the child is also compared with its parent's on the same items (``statistics[AGAINST_PARENT]``:
    the accuracy difference with McNemar's p, or the perplexity ratio, each with its paired interval)."""
    add_paired("parent", parent_results, results, field=AGAINST_PARENT)
    base_by_key = {result_key(result): result for result in baseline_results}
    parent_by_key = {result_key(result): result for result in parent_results}
    for result in results:
        key = result_key(result)
        statistics = result.settings.get("statistics") or {}
        if result.metric != "perplexity" or key not in base_by_key or key not in parent_by_key:
            continue
        base, parent = (by_key[key].settings.get("statistics") for by_key in (base_by_key, parent_by_key))
        if base is None or parent is None or "paired" not in statistics:
            continue
        try:
            parent_windows, child_windows = (
                windows_in_order(other["items"], aligned(base["items"], other["items"]))
                for other in (parent, statistics)
            )
        except PairingRefused:
            continue
        dense_windows = (base["items"]["nll"], base["items"]["tokens"])
        statistics["paired"].update(gap_recovered(dense_windows, parent_windows, child_windows))


def compare_statistics(baseline: dict, model: dict) -> dict:
    """The paired fields of one result against the baseline's (both ``settings["statistics"]``).

    Raises:
        PairingRefused: the two results hold different items.
    """
    base_items, model_items = baseline["items"], model["items"]
    order = aligned(base_items, model_items)
    if "correct" in base_items:
        base = [int(bit) for bit in base_items["correct"]]
        other = [int(model_items["correct"][index]) for index in order]
        paired = paired_accuracy(base, other)
    else:
        paired = paired_perplexity(
            (base_items["nll"], base_items["tokens"]), windows_in_order(model_items, order)
        )
    return {**paired, "paired_method": PAIRED_BOOTSTRAP, "paired_seed": SEED}


def result_key(result) -> tuple[str, str, str]:
    """``(suite, task, metric)``: what pairs a result with the baseline's."""
    return result.suite, result.task, result.metric


def add_paired(
    baseline_label: str, baseline_results: Sequence, results: Sequence, field: str = "paired"
) -> None:
    """Write each result's comparison with the baseline's same result into its ``statistics[field]``."""
    by_key = {result_key(result): result for result in baseline_results}
    for result in results:
        statistics = result.settings.get("statistics")
        base = by_key.get(result_key(result))
        if statistics is None or base is None or "statistics" not in base.settings:
            continue
        try:
            paired = compare_statistics(base.settings["statistics"], statistics)
        except PairingRefused as refused:
            paired = {"verdict": f"not paired: {refused}"}
        statistics[field] = {"baseline": baseline_label, **paired}


def task_record(result) -> dict:
    """One result as the JSON shows it: suite, task, metric, ``n``, value and interval, paired fields."""
    statistics = result.settings.get("statistics") or {}
    record = {"suite": result.suite, "task": result.task, "metric": result.metric}
    record.update(summary({key: value for key, value in statistics.items() if key != "paired"}))
    record.setdefault("accuracy" if result.metric != "perplexity" else "perplexity", result.value)
    record.update(statistics.get("paired", {}))
    return record


def task_records(results: Sequence, primary_only: bool = True) -> dict[str, dict]:
    """``{task: record}`` of one model's results (:func:`task_record`).

    Args:
        results: the model's :class:`~pruning.evaluation.suites.EvalResult` list.
        primary_only: per task only its perplexity or the accuracy the study reports (``acc_norm`` where
            lm-eval defines it, :func:`~pruning.evaluation.results.primary_metric`); False keeps every
            metric, keyed ``task/metric``.

    A task name two suites share is keyed ``suite/task``.
    """
    from pruning.evaluation.results import primary_metric

    measured: dict[tuple[str, str], list[str]] = {}
    suites: dict[str, set[str]] = {}
    for result in results:
        measured.setdefault((result.suite, result.task), []).append(result.metric)
        suites.setdefault(result.task, set()).add(result.suite)
    records = {}
    for result in results:
        reported = primary_metric(result.task, measured[(result.suite, result.task)])
        if primary_only and result.metric not in ("perplexity", reported):
            continue
        name = result.task if len(suites[result.task]) == 1 else f"{result.suite}/{result.task}"
        if not primary_only and result.metric != "perplexity":
            name = f"{name}/{result.metric}"
        records[name] = task_record(result)
    return records


def paired_comparison(models: Sequence[ComparedModel], primary_only: bool = True) -> list[dict]:
    """The comparison of every model with the first, as data: one object per model, baseline first.

    Args:
        models: the baseline first, then the models to compare with it (their results get the paired
            fields, as :func:`add_paired` writes them).
        primary_only: see :func:`task_records`.

    Returns:
        ``[{"model": label, "baseline": bool, "tasks": {task: record}}]``; a record has the fields of
        :func:`task_record`.
    """
    if not models:
        return []
    baseline = models[0]
    output = []
    for number, model in enumerate(models):
        if number:
            add_paired(baseline.label, baseline.results, model.results)
        tasks = task_records(model.results, primary_only)
        output.append({"model": model.label, "baseline": number == 0, "tasks": tasks})
    return output


def recorded_comparison(registry, names: Sequence[str], primary_only: bool = True) -> list[dict]:
    """:func:`paired_comparison` of what the registry recorded for ``names`` (the baseline first).

    For each (suite, task, metric) the latest evaluation of each model is used; pairing is refused (said in
    ``verdict``) where its items differ from the baseline's.
    """
    from pruning.evaluation.results import EvalResult

    models = []
    for name in names:
        latest: dict[tuple[str, str, str], object] = {}
        for info in registry.evaluations(name):
            key = (info.suite, info.task, info.metric)
            if key not in latest or info.created_at >= latest[key].created_at:
                latest[key] = info
        results = [
            EvalResult(info.suite, info.task, info.metric, info.value, dict(info.settings))
            for info in latest.values()
        ]
        models.append(ComparedModel(name, results))
    return paired_comparison(models, primary_only)
