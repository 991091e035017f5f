"""What every part of a study's reading stands on: the paper's facts and budgets, the paper's seven
searches, how a cell names its configuration and calibration draw, and what a set of cells records (data
seeds, reused cells, truncated items). :mod:`pruning.study.reading` and :mod:`pruning.study.cross_reading`
both read these."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from pruning.study.tables import short_data

STUDY_SEARCHES = ("one_shot", "greedy", "beam", "genetic", "bayesian", "cbo", "fast_block_select")
"""The paper's seven (as :data:`pruning.search.STUDY_SEARCHES`; kept here so reading needs no torch)."""


@dataclass(frozen=True)
class PaperFacts:
    """The paper's numbers a reading compares with (arXiv 2604.24938)."""

    blocks: int = 32
    """Blocks of LLaMA3-8B, against which the budgets are stated."""
    budgets: tuple[int, ...] = (7, 9)
    """Blocks removed."""
    movement_configuration_mean: float = 2.06
    """§5.2: mean |Δ accuracy| (points) when the calibration configuration changes."""
    movement_search_mean: float = 1.85
    """§5.2: mean |Δ accuracy| (points) when the search changes."""
    spearman_negative_cells: tuple[int, int] = (5, 6)
    """§5.3: cells whose ρ(perplexity rank, accuracy rank) over the seven is negative, of the cells."""
    variance_margin_m9: float = 0.69
    """σ² of accuracy (points²) across the seven, LLaMA3 under the margin at M = 9."""


PAPER = PaperFacts()


def paper_budgets(num_blocks: int, paper: PaperFacts = PAPER) -> dict[int, int]:
    """``M for this model -> the paper's M`` by the fraction of blocks removed (30 blocks: 7 -> 7, 8 -> 9)."""
    return {round(budget * num_blocks / paper.blocks): budget for budget in paper.budgets}


def data_seed(cell: dict) -> int | None:
    """The cell's calibration draw: its ``data_seed``, else the key's calibration-seed field (older cells)."""
    if cell.get("data_seed") is not None:
        return int(cell["data_seed"])
    fields = str(cell.get("key", "")).split("|")
    return int(fields[4]) if len(fields) > 4 and fields[4].isdigit() else None


def configuration(cell: dict) -> str:
    """``objective on data`` (paths shortened to their file name)."""
    return f"{cell['objective']} on {short_data(cell['data'])}"


def provenance_facts(cells: Sequence[dict]) -> dict:
    """Data seeds (recorded or read from keys), reused cells, truncated items (recorded or not) of ``cells``
    (a study.json's cells)."""
    recorded = all("data_seed" in c and c["data_seed"] is not None for c in cells)
    seeds_by_seed = defaultdict(set)
    for cell in cells:
        seeds_by_seed[cell["seed"]].add(data_seed(cell))
    draws = sorted({s for found in seeds_by_seed.values() for s in found if s is not None})
    return {
        "data_seed_recorded": recorded,
        "data_seeds": draws,
        "draw_varies_with_seed": len(draws) > 1,
        "seeds": sorted(seeds_by_seed),
        "reused": sum(1 for c in cells if c.get("reused_from")),
        "truncation_recorded": all("truncated_items" in c for c in cells),
        "truncated_items": sum(int(c.get("truncated_items") or 0) for c in cells),
    }


def budget_label(facts: dict, drop) -> str:
    """``M = 8 (≈ the paper's 9)`` or ``M = 10 (extension)``."""
    paper = next((b["paper"] for b in facts["budgets"] if b["drop"] == drop), None)
    return f"M = {drop} (≈ the paper's {paper})" if paper else f"M = {drop} (extension)"
