"""The study report: tables (Markdown and HTML), figures (PNG) and the raw numbers (JSON) of a study grid.

:func:`write_report` takes the finished cells of :mod:`pruning.study.cells` and writes into one directory:

* ``README.md`` and ``report.html`` — setup, the headline comparison (mask agreement across searches under
  one calibration vs across calibrations under one search), perplexity with its Avg (Table 1), zero-shot
  accuracy per budget (Tables 2 and 3; each task's reported metric, in points), the accuracy movement of a
  configuration change vs a search change (§5.2), search cost vs accuracy, pairwise Jaccard mean/range and
  full overlap per cell and pooled over cells, inter-method variance σ² (accuracy in points²), Spearman ρ
  between the Avg-perplexity rank and the accuracy rank, and, when run, the seed-stability and random-prior
  controls (one function each in :mod:`pruning.study.tables`, whose docstring states the conventions); the
  per-cell statistics over the paper's seven searches and, when more ran, over all;
* ``figures/`` — the heatmaps, the trade-off and the rank-correlation figures (:mod:`pruning.study.figures`);
* ``study.json`` — every cell with its mask, losses, costs and metrics.

With ``study --heal``, the healing sections of :mod:`pruning.study.healing` come before the figures.
"""

from __future__ import annotations

import dataclasses
import html
import json
from collections.abc import Sequence
from pathlib import Path

from pruning.study.figures import draw_figures
from pruning.study.tables import Section, build_sections, model_name

# -------------------------------------------------------------------------------------------- rendering


def render_markdown(title: str, sections: Sequence[Section], reading: str | None = None) -> str:
    """The report as GitHub Markdown."""
    lines = [f"# {title}", ""]
    if reading:
        lines += ["## Reading", "", reading.strip(), ""]
    for section in sections:
        lines += [f"## {section.title}", ""]
        for paragraph in section.text:
            lines += [paragraph, ""]
        if section.header:
            lines.append("| " + " | ".join(section.header) + " |")
            lines.append("|" + "|".join("---" for _ in section.header) + "|")
            lines += [
                "| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in section.rows
            ]
            lines.append("")
        for image in section.images:
            lines += [f"![{Path(image).stem}]({image})", ""]
    return "\n".join(lines)


def render_html(title: str, sections: Sequence[Section], reading: str | None = None) -> str:
    """The report as one self-contained HTML page (figures linked relative to it)."""

    def inline(text: str) -> str:
        escaped = html.escape(text)
        parts = escaped.split("`")
        return "".join(f"<code>{part}</code>" if i % 2 else part for i, part in enumerate(parts))

    body = [f"<h1>{html.escape(title)}</h1>"]
    if reading:
        body += ["<h2>Reading</h2>"] + [f"<p>{inline(p)}</p>" for p in reading.strip().split("\n\n")]
    for section in sections:
        body.append(f"<h2>{html.escape(section.title)}</h2>")
        body += [f"<p>{inline(paragraph)}</p>" for paragraph in section.text]
        if section.header:
            body.append(
                "<table><thead><tr>"
                + "".join(f"<th>{html.escape(h)}</th>" for h in section.header)
                + "</tr></thead><tbody>"
            )
            body += [
                "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>"
                for row in section.rows
            ]
            body.append("</tbody></table>")
        body += [
            f'<p><img src="{html.escape(image)}" alt="{html.escape(Path(image).stem)}"></p>'
            for image in section.images
        ]
    style = (
        "body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;"
        "text-align:right;font-variant-numeric:tabular-nums}th{background:#f3f3f3}img{max-width:100%}"
    )
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


# ------------------------------------------------------------------------------------------------- entry


def write_report(
    out: Path, summary: dict, cells: Sequence, dense: dict, reading: str | None = None, healing=None
) -> Path:
    """Write ``README.md``, ``report.html``, ``study.json`` and ``figures/`` into ``out``.

    Args:
        out: the report directory.
        summary: the study's setup (:func:`pruning.study.plan_summary`).
        cells: finished cells (:class:`pruning.study.CellResult`), metrics filled in.
        dense: the dense model's metrics, ``"task/metric" -> value``.
        reading: optional interpretation placed at the top (kept in ``reading.md``); the generated one is
            :func:`pruning.study.reading.write_reading`'s.
        healing: the study's healed variants (:class:`pruning.study.healing.StudyHealing`), when it healed:
            adds the healing sections before the figures and ``healing`` to ``study.json``.

    Returns:
        The path of ``README.md``.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    reading_file = out / "reading.md"
    if reading is None and reading_file.is_file():
        reading = reading_file.read_text()
    elif reading is not None:
        reading_file.write_text(reading)
    sections, numbers = build_sections(summary, cells, dense)
    if healing is not None:
        from pruning.study.healing import healing_sections

        healed, numbers["healing"] = healing_sections(summary, cells, dense, healing)
        figures = next((i for i, section in enumerate(sections) if section.title == "Figures"), len(sections))
        sections[figures:figures] = healed
    draw_figures(out / "figures", summary, cells, dense)
    title = f"Depth-pruning study: {model_name(summary)}"
    (out / "README.md").write_text(render_markdown(title, sections, reading))
    (out / "report.html").write_text(render_html(title, sections, reading))
    (out / "study.json").write_text(
        json.dumps(
            {"summary": summary, "dense": dense, **numbers, "cells": [dataclasses.asdict(c) for c in cells]},
            indent=1,
            default=str,
        )
    )
    return out / "README.md"
