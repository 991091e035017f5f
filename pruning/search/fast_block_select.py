"""MI-PRUN's Fast-Block-Select (Zhang et al., 2026) on the unified calibration metric.

MI-PRUN scores single blocks by −MI(h_in, h_out); like the study, this implementation uses the
single-block *calibration loss* instead (the shared prior), so that FBS differs from the other searches
only in how it searches. The procedure:

With ``prior="random"`` (the control) the real single-block losses are dealt to the blocks in a seeded
random order, because step 3 compares prior increments with true segment costs on one scale.

1. **Prune and alternative sets.** Rank blocks by the prior; the M lowest form the prune set P (the
   one-shot solution), the next ``alternatives`` (default M) form the alternative set.
2. **Segments.** Every run of consecutive block indices of length 2..M lying inside P ∪ alternatives is a
   candidate segment. Segments are ranked by their summed prior increments Σ(s_i − L_dense) and the
   top ``segments`` (K) get a *true segment score* σ(G) = L(G removed) − L_dense: removing adjacent blocks
   together often costs much less (or more) than the sum of their single costs.
3. **Swaps until stable.** The cost of a removal set is estimated additively from the prior, corrected by
   the true scores of the evaluated segments it contains (disjoint segments, best synergy first). For each
   evaluated segment not inside P, the swap that brings it in and sends out the same number of P's
   costliest other blocks is scored by its estimated gain. The positive-gain swaps that touch disjoint
   blocks (conflict-free) are applied together and the new P gets a true score; if that is worse than
   the current set, only the single best swap is tried instead. This repeats until no swap has positive
   estimated gain, a set repeats, neither move improves the true loss, or ``max_rounds`` is reached.
4. **History.** Every configuration scored is kept; the best seen (true loss) is returned, so a round
   whose batch of swaps looked good under the surrogate but was worse never costs the result.

Cost: the N prior evaluations (shared), K segment evaluations, one or two per round. Under
``--timing standalone`` (:mod:`pruning.pipeline.prune`) the prior is computed before FBS's clock starts and
not charged to it, as the study's Table 4 does (its FBS time is below one-shot's, which is the prior).

Protected blocks (``--protect``) are left out of the ranking, so they are in neither set nor any segment.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tqdm.auto import tqdm

from pruning.search import base


@dataclass
class Options(base.SearchOptions):
    """Settings of Fast-Block-Select."""

    alternatives: int | None = base.integer(None, minimum=0, optional=True)
    """Size of the alternative set; None = M."""
    segments: int = base.integer(8)
    """K, segments given a true segment score."""
    max_rounds: int = base.integer(20)
    """Upper bound on swap rounds."""
    prior: str = base.one_of("single_block", base.PRIOR_KINDS)
    """``single_block`` (the study's) or ``random`` (a seeded random ranking: the control)."""


def candidate_segments(pool: set[int], budget: int) -> list[tuple[int, ...]]:
    """Every run of 2..budget consecutive indices inside ``pool``."""
    found = []
    for start in sorted(pool):
        end = start
        while end + 1 in pool and end + 1 - start + 1 <= budget:
            end += 1
            found.append(tuple(range(start, end + 1)))
    return found


def estimated_cost(removed: frozenset[int], increments: np.ndarray, segment_costs: dict) -> float:
    """Additive prior cost of ``removed``, corrected by the true scores of disjoint segments inside it."""
    cost = float(sum(increments[block] for block in removed))
    synergies = sorted(
        (
            (float(sum(increments[b] for b in segment)) - true_cost, segment)
            for segment, true_cost in segment_costs.items()
            if set(segment) <= removed
        ),
        reverse=True,
    )
    used: set[int] = set()
    for synergy, segment in synergies:
        if used.isdisjoint(segment):
            cost -= synergy
            used.update(segment)
    return cost


def loss_scale_prior(objective: base.SubsetObjective, prior: str, seed: int) -> np.ndarray:
    """Single-block scores on the loss scale: the real ones, or (``prior="random"``) them dealt at random."""
    scores = base.prior_scores(objective, prior, seed)
    if prior == "random":
        # FBS compares prior increments with true segment costs, so the control needs loss-scale values:
        # the real single-block losses dealt to blocks in a seeded random order (no information, same scale).
        real = np.sort(np.asarray(objective.single_block_scores(), dtype=np.float64))
        scores = real[scores.astype(np.int64)]
    return scores


def score_segments(
    objective: base.SubsetObjective,
    pool: set[int],
    budget: int,
    increments: np.ndarray,
    dense: float,
    count: int,
) -> dict[tuple[int, ...], float]:
    """True segment scores σ(G) = L(G removed) − L_dense of the ``count`` segments with lowest prior sum."""
    segments = candidate_segments(pool, budget)
    segments.sort(key=lambda segment: (float(sum(increments[b] for b in segment)), segment))
    return {segment: objective.score(base.as_key(segment)) - dense for segment in segments[:count]}


def positive_swaps(current: frozenset[int], increments: np.ndarray, segment_costs: dict) -> list[tuple]:
    """Swaps bringing an evaluated segment into ``current``, with positive estimated gain, best first.

    Each swap is ``(gain, segment, incoming, outgoing)``: the segment's blocks not yet removed come in, as
    many of the current set's costliest other blocks go out.
    """
    base_cost = estimated_cost(current, increments, segment_costs)
    swaps = []
    for segment in segment_costs:
        incoming = set(segment) - current
        if not incoming:
            continue
        others = sorted(current - set(segment), key=lambda block: (-increments[block], block))
        outgoing = set(others[: len(incoming)])
        proposal = base.as_key((current - outgoing) | incoming)
        gain = base_cost - estimated_cost(proposal, increments, segment_costs)
        if gain > 1e-12:
            swaps.append((gain, segment, incoming, outgoing))
    swaps.sort(key=lambda swap: (-swap[0], swap[1]))
    return swaps


def candidate_moves(current: frozenset[int], swaps: list[tuple]) -> list[tuple[str, frozenset[int]]]:
    """The batch of conflict-free swaps (greedy by gain), then the single best swap when it differs."""
    touched: set[int] = set()
    batch_in: set[int] = set()
    batch_out: set[int] = set()
    for _gain, _segment, incoming, outgoing in swaps:
        if touched.isdisjoint(incoming | outgoing):
            batch_in |= incoming
            batch_out |= outgoing
            touched |= incoming | outgoing
    moves = [("batch", base.as_key((current - batch_out) | batch_in))]
    best_single = base.as_key((current - swaps[0][3]) | swaps[0][2])
    if best_single != moves[0][1]:
        moves.append(("single", best_single))
    return moves


def try_moves(
    objective: base.SubsetObjective,
    current: frozenset[int],
    moves: list,
    round_number: int,
    seen: set,
    history: list,
) -> frozenset[int] | None:
    """Score the moves not seen before, in order, recording each; the first that beats ``current`` wins."""
    current_loss = objective.score(current)
    for move, proposal in moves:
        if proposal in seen:
            continue
        seen.add(proposal)
        loss = objective.score(proposal)
        history.append({"round": round_number, "removed": sorted(proposal), "loss": loss, "move": move})
        if loss < current_loss:
            return proposal
    return None


@base.define_search(Options, deterministic=True)
def search(
    objective: base.SubsetObjective, budget: int, settings: Options, seed: int, progress: bool
) -> base.SearchResult:
    """Fast-Block-Select: segment-aware swaps from the one-shot set, returning the best set seen.

    ``objective.score(frozenset())`` is the dense loss. The seed is used only by ``prior="random"``; the
    progress bar counts rounds.

    Returns:
        The best configuration in the history, its loss, and every configuration scored as history.
    """
    scores = loss_scale_prior(objective, settings.prior, seed)
    dense = objective.score(frozenset())
    increments = scores - dense
    eligible = set(base.eligible_blocks(objective))
    order = [int(block) for block in np.argsort(scores, kind="stable") if int(block) in eligible]
    alternatives = budget if settings.alternatives is None else settings.alternatives
    current = base.as_key(order[:budget])
    pool = set(order[: budget + alternatives])
    segment_costs = score_segments(objective, pool, budget, increments, dense, settings.segments)

    history = [{"round": 0, "removed": sorted(current), "loss": objective.score(current), "move": "one-shot"}]
    seen = {current}
    for round_number in tqdm(
        range(1, settings.max_rounds + 1), desc="fast_block_select", disable=not progress, leave=False
    ):
        swaps = positive_swaps(current, increments, segment_costs)
        if not swaps:
            break
        accepted = try_moves(objective, current, candidate_moves(current, swaps), round_number, seen, history)
        if accepted is None:
            break
        current = accepted
    best = min(history, key=lambda entry: (entry["loss"], entry["round"]))
    result = base.finish(objective, best["removed"], history, settings)
    result.options["segment_scores"] = {
        "-".join(map(str, segment)): cost for segment, cost in segment_costs.items()
    }
    return result
