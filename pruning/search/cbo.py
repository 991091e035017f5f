"""Constrained binary optimisation (CBO) of Jansen et al. (2026) on the unified calibration metric.

Give every block a scalar α_i on its residual branch (block output h + α_i·f_i(h)); removing block i
sets α_i from 1 to 0. To first order the per-sample loss change of removing the set x ∈ {0,1}^N is
−A_s·x, where A = ``objective.residual_gradients()`` holds the per-sample gradients dL_s/dα_i at α = 1
(m × N). CBO minimises the mean squared first-order change, the energy

    E(x) = xᵀ H x,   H = AᵀA / m,   subject to Σ x = M,

exactly, then re-ranks the ``keep`` lowest-energy states by the true calibration loss and returns the
best (the surrogate picks candidates, the real metric decides). The re-ranking needs only the lowest loss
exactly: the others may stop at a lower bound above it (the history's ``exact``), as greedy's candidates do.

**Exact enumeration.** All C(N, M) states are enumerated in vectorised numpy chunks without building
every combination in Python: a state is split into a prefix of M − t blocks and a tail of the t highest
blocks (t ≤ 3). Tails are precomputed once (their energies and one-hot matrix); for all prefixes ending at
block ℓ, E = E(prefix) + 2·(H·prefix)ᵀ·tail + E(tail) is one matrix product against the tails whose
lowest block exceeds ℓ. Measured on 2 CPU cores: C(32, 7) = 3.4 M states in 0.25 s, C(36, 9) = 94 M in
4.5 s.

**Above ``max_states``** (default 1,000 million, about a minute) exact enumeration is refused and the
solver falls back to a heuristic: ``restarts`` runs of steepest-descent swap local search on E, from
the M blocks with the lowest diagonal energy plus random starts, keeping every local optimum;
``options["exact"]`` is then False and ``options["solver"]`` says ``"local_search"``, so the registry
records that the surrogate optimum is not proven.

**Not under ``kl``.** The KL divergence to the dense model is zero at the dense model and never negative,
so every residual gradient of it is zero there: H = 0, every state has energy 0, and the "lowest" states
would be the first ones enumerated ({0, 1, ..., M−1}), a meaningless mask. The CBO paper expands the
model's own training loss, which has no such minimum at α = 1; it gives no gradient for a loss measured
against the dense model. So CBO refuses the ``kl`` objective with a one-line error (before computing any
gradient when the objective carries its calibration objective's facts, whose ``zero_gradient_at_dense`` says
so, else when every gradient is zero).

Protected blocks (``--protect``) are left out of the enumeration: H is restricted to the eligible blocks.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass

import numpy as np
from tqdm.auto import tqdm

from ground.core.errors import UserError
from ground.core.objectives import OBJECTIVES, Objective
from pruning.search import base

TAIL_SIZE = 3
CHUNK_ELEMENTS = 4_000_000

ZERO_REFUSAL = (
    "cbo cannot run: every residual gradient of the objective is zero (the dense model is its minimum, "
    "as for kl), so CBO's energy is zero for every set; use another objective or search"
)


@dataclass
class Options(base.SearchOptions):
    """Settings of CBO."""

    keep: int = base.integer(10)
    """Lowest-energy states re-ranked by the true calibration loss."""
    max_states: int = base.integer(1_000_000_000)
    """Largest C(N, M) enumerated exactly; above it the local-search fallback runs (flagged)."""
    restarts: int = base.integer(64)
    """Local-search starts of the fallback."""


def energy_matrix(gradients: np.ndarray) -> np.ndarray:
    """H = AᵀA / m from the per-sample residual gradients A (m × N)."""
    gradients = np.asarray(gradients, dtype=np.float64)
    if gradients.ndim != 2 or gradients.shape[0] < 1:
        raise ValueError(
            f"residual_gradients() must be a non-empty [m, N] array, got shape {gradients.shape}"
        )
    return gradients.T @ gradients / gradients.shape[0]


def state_energies(hessian: np.ndarray, states: np.ndarray) -> np.ndarray:
    """xᵀHx for each row of ``states`` (block indices, shape [S, k])."""
    if states.shape[1] == 0:
        return np.zeros(len(states))
    return hessian[states[:, :, None], states[:, None, :]].sum(axis=(1, 2))


class _LowestStates:
    """The ``keep`` lowest-energy states seen so far (ties: lexicographically first)."""

    def __init__(self, keep: int):
        self.keep = keep
        self.heap: list[tuple[float, tuple[int, ...]]] = []  # max-heap via negated keys

    def offer(self, energies: np.ndarray, states: np.ndarray) -> None:
        if len(energies) > self.keep:
            candidates = np.argpartition(energies, self.keep - 1)[: self.keep]
        else:
            candidates = np.arange(len(energies))
        for index in candidates:
            item = (float(energies[index]), tuple(int(block) for block in states[index]))
            negated = (-item[0], tuple(-block for block in item[1]))
            if len(self.heap) < self.keep:
                heapq.heappush(self.heap, negated)
            elif negated > self.heap[0]:
                heapq.heapreplace(self.heap, negated)

    def sorted(self) -> list[tuple[float, tuple[int, ...]]]:
        items = [(-energy, tuple(-block for block in state)) for energy, state in self.heap]
        return sorted(items)


def enumerate_lowest(hessian: np.ndarray, budget: int, keep: int, progress: bool = False):
    """The ``keep`` lowest-energy size-``budget`` states, by exact enumeration.

    Returns:
        ``[(energy, sorted blocks), ...]`` ascending by energy.
    """
    num_blocks = len(hessian)
    tail_size = min(TAIL_SIZE, budget)
    prefix_size = budget - tail_size
    tails = np.array(list(itertools.combinations(range(num_blocks), tail_size)), dtype=np.int64)
    tails = tails.reshape(-1, tail_size)
    tail_energies = state_energies(hessian, tails)
    tail_onehot = np.zeros((len(tails), num_blocks))
    np.put_along_axis(tail_onehot, tails, 1.0, axis=1)
    tail_first = tails[:, 0] if tail_size else np.full(len(tails), num_blocks)
    best = _LowestStates(keep)
    if prefix_size == 0:
        best.offer(tail_energies, tails)
        return best.sorted()

    total = math.comb(num_blocks, budget)
    with tqdm(total=total, desc="cbo enumerate", disable=not progress, leave=False, unit_scale=True) as bar:
        for last in range(prefix_size - 1, num_blocks - tail_size):
            valid_tails = np.nonzero(tail_first > last)[0]
            if len(valid_tails) == 0:
                continue
            head_iterator = itertools.combinations(range(last), prefix_size - 1)
            rows_per_chunk = max(1, CHUNK_ELEMENTS // len(valid_tails))
            while batch := list(itertools.islice(head_iterator, rows_per_chunk)):
                heads = np.array(batch, dtype=np.int64).reshape(len(batch), prefix_size - 1)
                prefixes = np.concatenate([heads, np.full((len(batch), 1), last, dtype=np.int64)], axis=1)
                prefix_energies = state_energies(hessian, prefixes)
                coupling = hessian[prefixes].sum(axis=1)  # [P, N]: row p is H·x_prefix
                energies = (
                    prefix_energies[:, None]
                    + 2.0 * coupling @ tail_onehot[valid_tails].T
                    + tail_energies[valid_tails][None, :]
                )
                flat = energies.ravel()
                if flat.size > keep:
                    picks = np.argpartition(flat, keep - 1)[:keep]
                else:
                    picks = np.arange(flat.size)
                rows, columns = np.divmod(picks, len(valid_tails))
                states = np.concatenate([prefixes[rows], tails[valid_tails[columns]]], axis=1)
                best.offer(flat[picks], states)
                bar.update(flat.size)
    return best.sorted()


def local_search_lowest(
    hessian: np.ndarray,
    budget: int,
    keep: int,
    restarts: int,
    rng: np.random.Generator,
    progress: bool = False,
):
    """Heuristic fallback: steepest-descent swap search on xᵀHx from several starts.

    Returns:
        ``[(energy, sorted blocks), ...]`` of the distinct local optima found, lowest ``keep``.
    """
    num_blocks = len(hessian)
    diagonal = np.diag(hessian)
    starts = [np.argsort(diagonal, kind="stable")[:budget]]
    starts += [rng.choice(num_blocks, size=budget, replace=False) for _ in range(restarts - 1)]
    optima: dict[tuple[int, ...], float] = {}
    for start in tqdm(starts, desc="cbo local search", disable=not progress, leave=False):
        x = np.zeros(num_blocks)
        x[start] = 1.0
        while True:
            field = hessian @ x  # energy change of swapping i out and j in:
            # ΔE = 2(field_j − field_i) + H_jj + H_ii − 2H_ij
            removed, kept = np.nonzero(x)[0], np.nonzero(x == 0)[0]
            delta = (
                2 * (field[kept][None, :] - field[removed][:, None])
                + diagonal[kept][None, :]
                + diagonal[removed][:, None]
                - 2 * hessian[np.ix_(removed, kept)]
            )
            out_index, in_index = np.unravel_index(np.argmin(delta), delta.shape)
            if delta[out_index, in_index] >= -1e-12:
                break
            x[removed[out_index]], x[kept[in_index]] = 0.0, 1.0
        state = tuple(int(block) for block in np.nonzero(x)[0])
        optima[state] = float(x @ hessian @ x)
    return sorted((energy, state) for state, energy in optima.items())[:keep]


def check_objective(calibration: Objective) -> None:
    """Refuse a calibration objective whose gradients vanish at the dense model (module docstring).

    Raises:
        UserError: the objective's ``zero_gradient_at_dense`` is set (``kl``).
    """
    if calibration.zero_gradient_at_dense:
        usable = " or ".join(name for name, other in OBJECTIVES.items() if not other.zero_gradient_at_dense)
        raise UserError(
            f"cbo cannot run under the {calibration.name} objective: {calibration.display_name} to the dense "
            f"model is minimal at the dense model, so its residual gradients and CBO's energy are zero for "
            f"every set; use {usable}, or another search"
        )


@base.define_search(Options, deterministic=False, check_objective=check_objective)
def search(
    objective: base.SubsetObjective, budget: int, settings: Options, seed: int, progress: bool
) -> base.SearchResult:
    """Minimise the gradient surrogate xᵀHx (from ``residual_gradients()``) exactly, then re-rank the lowest
    states by the true loss. The seed draws the fallback's random starts (exact enumeration is deterministic,
    but whether it is refused, above ``max_states``, a study cannot know before the run: not deterministic).

    Returns:
        The re-ranked best state, its loss, and the kept states with energy and true loss as history;
        ``options`` records ``exact`` and ``solver``.

    Raises:
        UserError: a bad budget or option, or the ``kl`` objective (its gradients vanish: module doc).
    """
    calibration = getattr(objective, "calibration_objective", None)  # synthetic objectives have none
    if calibration is not None:
        check_objective(calibration)
    gradients = np.asarray(objective.residual_gradients(), dtype=np.float64)
    if gradients.size and not np.any(gradients):
        raise UserError(ZERO_REFUSAL)
    hessian = energy_matrix(gradients)
    if hessian.shape != (objective.num_blocks, objective.num_blocks):
        raise ValueError(
            f"residual_gradients() has {hessian.shape[0]} columns, expected {objective.num_blocks}"
        )
    blocks = np.array(base.eligible_blocks(objective))
    eligible_hessian = hessian[np.ix_(blocks, blocks)]
    exact = math.comb(len(blocks), budget) <= settings.max_states
    if exact:
        positions = enumerate_lowest(eligible_hessian, budget, settings.keep, progress)
    else:
        positions = local_search_lowest(
            eligible_hessian, budget, settings.keep, settings.restarts, np.random.default_rng(seed), progress
        )
    # Positions among the eligible blocks back to block indices (the identity when none is protected).
    states = [(energy, tuple(int(blocks[position]) for position in state)) for energy, state in positions]
    # Only the lowest true loss decides, so the states are ranked as greedy ranks its candidates: the lowest
    # (and any tied with it) exact, the others possibly a lower bound above it (``exact`` False). A budget
    # matched to greedy's re-ranks hundreds of states: scored one by one, each runs the LM head in full.
    ranked = base.rank_lowest(objective, [state for _, state in states], keep=1)
    history = [
        {
            "energy_rank": rank,
            "removed": list(state),
            "energy": energy,
            "loss": answer.loss,
            "exact": answer.exact,
        }
        for rank, ((energy, state), answer) in enumerate(zip(states, ranked, strict=True))
    ]
    chosen = min(
        (entry for entry in history if entry["exact"]),
        key=lambda entry: (entry["loss"], entry["energy_rank"]),
    )
    result = base.finish(objective, chosen["removed"], history, settings)
    result.options.update(exact=exact, solver="enumeration" if exact else "local_search")
    return result
