"""Quality tables as people read them: every figure with its 95 % interval, never cut, within 100 columns.

``depthprune eval`` prints, per model, one row per task: ``n``, the value and its interval
(``0.62 [0.55, 0.69]``, ``312.4 [290.1, 335.0]``); for every model after the first, a second table gives
the paired change against the first (``-0.030 [-0.080, +0.020]``, ``x1.063 [1.012, 1.104]``), the
retention (``94.1 % [90.6, 98.8]``) and the verdict; a repaired child named after its parent adds the
fraction of its parent's perplexity gap it recovered (``0.412 [0.371, 0.455]``). Plain text, columns sized
to their content: a terminal narrower than the table wraps a line instead of eliding a number.
"""

from __future__ import annotations

from collections.abc import Sequence


def number(value: float | None, kind: str) -> str:
    """One figure: an accuracy (2 decimals), a perplexity (1 decimal from 100, else 2), a ratio (3)."""
    if value is None:
        return "-"
    if kind == "accuracy":
        return f"{value:.2f}"
    if kind == "perplexity":
        return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.2f}"
    if kind == "delta":
        return f"{value:+.3f}"
    if kind == "retention":
        return f"{value:.1f}"
    return f"{value:.3f}"


def with_interval(value: float | None, ci95: Sequence[float] | None, kind: str, prefix: str = "") -> str:
    """``0.62 [0.55, 0.69]``: the value and its interval in the same format (``-`` for a missing one)."""
    if value is None:
        return "-"
    text = prefix + number(value, kind)
    if ci95 is None:
        return text
    return f"{text} [{number(ci95[0], kind)}, {number(ci95[1], kind)}]"


def value_cells(record: dict) -> list[str]:
    """The value row of one task record (:func:`pruning.evaluation.paired.task_record`)."""
    kind = "perplexity" if "perplexity" in record else "accuracy"
    value = with_interval(record.get(kind), record.get(f"{kind}_ci95"), kind)
    return [record["task"], record["metric"], str(record.get("n", "-")), value]


def change_cells(record: dict) -> list[str]:
    """The paired row of one task record: change, retention and verdict against the baseline."""
    if "perplexity" in record:
        change = with_interval(
            record.get("perplexity_ratio"), record.get("perplexity_ratio_ci95"), "ratio", prefix="x"
        )
    else:
        change = with_interval(record.get("accuracy_delta"), record.get("accuracy_delta_ci95"), "delta")
    retention = with_interval(record.get("retention"), record.get("retention_ci95"), "retention")
    retention = retention.replace(" [", " % [", 1) if retention != "-" else retention
    return [record["task"], change, retention, record.get("verdict", "-")]


def gap_lines(records: Sequence[dict]) -> list[str]:
    """A repaired child named after its parent: the fraction of the parent's log-perplexity gap to the
    baseline it closed, per text (:func:`pruning.evaluation.paired.gap_recovered`)."""
    gaps = [
        f"{record['task']} {with_interval(record['gap_recovered'], record['gap_recovered_ci95'], 'ratio')}"
        for record in records
        if record.get("gap_recovered") is not None
    ]
    if not gaps:
        return []
    return ["  gap to the baseline recovered from its parent (1 = all, 0 = none): " + "; ".join(gaps)]


def aligned_rows(rows: list[list[str]], numeric: Sequence[int]) -> list[str]:
    """Rows as lines, each column padded to its widest cell (the ``numeric`` columns right-aligned)."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [
            cell.rjust(widths[column]) if column in numeric else cell.ljust(widths[column])
            for column, cell in enumerate(row)
        ]
        lines.append("  " + "  ".join(cells).rstrip())
    return lines


def quality_lines(models: Sequence[dict]) -> list[str]:
    """The lines of the quality tables of ``eval --json``'s objects (:func:`~.suites.results_as_json`).

    Args:
        models: one object per model, the baseline first, each with ``label``, ``variant`` and ``tasks``.
    """
    lines: list[str] = []
    for model in models:
        recorded = f"recorded as {model['variant']}" if model.get("variant") else "not recorded"
        role = "the baseline" if model["baseline"] else "paired against the baseline"
        lines.append(f"{model['label']} ({recorded}; {role})")
        if not model["tasks"]:
            lines += ["  (no results)", ""]
            continue
        records = list(model["tasks"].values())
        header = ["task", "metric", "n", "value [95 % CI]"]
        lines += aligned_rows([header] + [value_cells(record) for record in records], numeric=(2, 3))
        if not model["baseline"]:
            header = ["task", "change [95 % CI]", "retention [95 % CI]", "verdict"]
            lines += aligned_rows([header] + [change_cells(record) for record in records], numeric=(1, 2))
            lines += gap_lines(records)
        lines.append("")
    return lines
