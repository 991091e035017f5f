"""The paper's facts a study's reading and figures compare with (arXiv 2604.24938): its model's block count,
budgets, objectives and the numbers of its §5.2, §5.3 and variance analysis. Kept apart from the reading so
that the tables and figures can name the paper's budgets without importing the reading."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PAPER", "PaperFacts", "paper_budgets"]


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
    objectives: tuple[str, ...] = ("perplexity", "task_margin")
    """Its calibration objectives (perplexity on C4, the task likelihood margin); others are extensions."""
    spearman_signs: tuple[tuple[str, str, int, int], ...] = (
        ("perplexity", "negative", 5, 6),
        ("task_margin", "positive", 6, 6),
    )
    """§5.3 per objective, ``(objective, sign, cells with that sign, cells)``: ρ(perplexity rank, accuracy
    rank) over the seven, one cell per model and budget (3 × 2), as issue 42's audit reads the paper."""
    variance_margin_m9: float = 0.69
    """σ² of accuracy (points²) across the seven, LLaMA3 under the margin at M = 9."""


PAPER = PaperFacts()


def paper_budgets(num_blocks: int, paper: PaperFacts = PAPER) -> dict[int, int]:
    """``M for this model -> the paper's M`` by the fraction of blocks removed (30 blocks: 7 -> 7, 8 -> 9)."""
    return {round(budget * num_blocks / paper.blocks): budget for budget in paper.budgets}
