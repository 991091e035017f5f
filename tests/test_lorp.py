"""LoRP and LLM-Streamline: allocations worked out by hand on a hand-made similarity matrix, and the
evaluator's block-input similarity on a tiny model (symmetric, unit diagonal, equal to a direct
computation)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from ground.core.errors import UserError
from pruning.calibration.config import CalibrationConfig
from pruning.calibration.scoring.build import build_evaluator
from pruning.search import lorp, streamline
from pruning.search.base import TrackedObjective


def hand_made_similarity() -> np.ndarray:
    """10 blocks in four groups {0,1,2} {3,4,5} {6,7} {8,9}; the first two and the last two groups are akin.

    Dyadic values, so that equal means are equal floats and the ties below are real ties.
    """
    similarity = np.full((10, 10), -0.25)
    similarity[:6, :6] = 0.25
    similarity[6:, 6:] = 0.375
    pairs = {(0, 1): 0.75, (0, 2): 0.625, (1, 2): 0.875, (3, 4): 0.8125, (3, 5): 0.625, (4, 5): 0.8125}
    pairs |= {(6, 7): 0.9375, (8, 9): 0.625}
    for (first, second), value in pairs.items():
        similarity[first, second] = similarity[second, first] = value
    np.fill_diagonal(similarity, 1.0)
    return similarity


class MatrixObjective:
    """An objective whose block-input similarity is a given matrix; a subset scores the sum of its blocks."""

    def __init__(self, similarity: np.ndarray):
        self.similarity = np.asarray(similarity, dtype=np.float64)
        self.num_blocks = len(self.similarity)
        self.scored: list[frozenset[int]] = []

    def score(self, removed_blocks: frozenset[int]) -> float:
        self.scored.append(frozenset(removed_blocks))
        return float(sum(removed_blocks))

    def block_input_similarity(self) -> np.ndarray:
        return self.similarity.copy()


def run_lorp(similarity: np.ndarray, budget: int, **options):
    return lorp.search(MatrixObjective(similarity), budget, progress=False, **options)


def chosen_order(result) -> list[int]:
    return [entry["block"] for entry in result.history]


# ------------------------------------------------------------------------------------------------ LoRP


@pytest.mark.parametrize(
    ("clusters", "labels"),
    [
        (2, [0, 0, 0, 0, 0, 0, 1, 1, 1, 1]),
        (3, [0, 0, 0, 1, 1, 1, 2, 2, 2, 2]),
        (4, [0, 0, 0, 1, 1, 1, 2, 2, 3, 3]),
    ],
)
def test_spectral_clusters_recover_the_groups(clusters, labels):
    for seed in range(3):
        assert lorp.spectral_clusters(hand_made_similarity(), clusters, seed) == labels


def test_clusters_are_reindexed_by_depth_and_need_not_be_contiguous():
    similarity = np.full((6, 6), -0.5)
    for group in ([0, 1, 5], [2, 3, 4]):
        for first in group:
            for second in group:
                similarity[first, second] = 0.9
    np.fill_diagonal(similarity, 1.0)
    assert lorp.spectral_clusters(similarity, 2, 0) == [0, 0, 1, 1, 1, 0]


# Rankings (mean similarity to the rest of the full cluster, protected blocks 0 and 9 included):
#   K=4: {0,1,2}: 1 (0.8125) > 2 (0.75); {3,4,5}: 4 (0.8125) > 3 = 5 (0.71875, tie -> 3 first);
#        {6,7}: 6 = 7 (tie -> 6); {8,9}: 8 (9 is protected)
#   K=3: {0,1,2} and {3,4,5} as above; {6,7,8,9}: 6 = 7 (0.5625) > 8 (0.4583)
#   K=2: {0..5}: 1 = 4 (0.475) > 2 (0.45) > 3 = 5 (0.4375); {6,7,8,9}: 6, 7, 8
# Stage 2 (mean pairwise similarity of the remaining members):
#   K=4, after 1 4 6 8: {0,2} 0.625 = {3,5} 0.625 (tie -> cluster 0 gives 2), {7} and {9} alone -> -inf;
#        then {3,5} 0.625 -> 3; then nothing has two members left: the first open cluster (1) gives 5, then 7.
#   K=3, after 1 4 6: {0,2} = {3,5} 0.625 > {7,8,9} 0.4583 -> 2; then 3; then {5} -inf < 0.4583 -> 7.
#   K=2, after 1 6: {0,2,3,4,5} 0.4375 < {7,8,9} 0.4583 -> 7; then {8,9} 0.625 -> 8; then cluster 0 -> 4.
@pytest.mark.parametrize(
    ("clusters", "budget", "order", "stages"),
    [
        (4, 2, [1, 4], [1, 1]),
        (4, 4, [1, 4, 6, 8], [1, 1, 1, 1]),
        (4, 6, [1, 4, 6, 8, 2, 3], [1, 1, 1, 1, 2, 2]),
        (4, 8, [1, 4, 6, 8, 2, 3, 5, 7], [1, 1, 1, 1, 2, 2, 2, 2]),
        (3, 3, [1, 4, 6], [1, 1, 1]),
        (3, 6, [1, 4, 6, 2, 3, 7], [1, 1, 1, 2, 2, 2]),
        (2, 1, [1], [1]),
        (2, 5, [1, 6, 7, 8, 4], [1, 1, 2, 2, 2]),
    ],
)
def test_allocation_worked_out_by_hand(clusters, budget, order, stages):
    result = run_lorp(hand_made_similarity(), budget, num_clusters=clusters)
    assert chosen_order(result) == order
    assert [entry["stage"] for entry in result.history] == stages
    assert result.removed_blocks == tuple(sorted(order))
    assert result.options["cluster_count"] == clusters


def test_stage_two_records_the_winning_residual_and_the_fallback():
    history = run_lorp(hand_made_similarity(), 8, num_clusters=4).history
    assert [entry["cluster"] for entry in history] == [0, 1, 2, 3, 0, 1, 1, 2]
    assert [entry["residual"] for entry in history[3:]] == [None, 0.625, 0.625, None, None]


def test_protection_is_an_option():
    similarity = hand_made_similarity()
    with pytest.raises(UserError, match="protected"):
        run_lorp(similarity, 9, num_clusters=4)
    # Block 0 unprotected ranks last in its cluster (0.6875 < 0.75); block 9 ties with 8 (0.625) and comes
    # after it. Once no cluster has two members left, the fallback visits clusters in depth order.
    unprotected = run_lorp(similarity, 9, num_clusters=4, protect_first=False, protect_last=False)
    assert chosen_order(unprotected) == [1, 4, 6, 8, 2, 3, 0, 5, 7]
    assert unprotected.options["cluster_rankings"] == [[1, 2, 0], [4, 3, 5], [6, 7], [8, 9]]
    last_unprotected = run_lorp(similarity, 9, num_clusters=4, protect_last=False)
    assert chosen_order(last_unprotected) == [1, 4, 6, 8, 2, 3, 5, 7, 9]


@pytest.mark.parametrize(("off_diagonal", "clusters"), [(0.45, 2), (0.55, 3), (0.6, 3), (0.62, 4), (0.7, 4)])
def test_locality_score_chooses_the_number_of_clusters(off_diagonal, clusters):
    similarity = np.full((8, 8), off_diagonal)
    similarity[:4, :4] = similarity[4:, 4:] = off_diagonal + 0.2
    similarity[:4, 4:] = similarity[4:, :4] = off_diagonal - 0.2 * 12 / 16  # keeps the mean over i < j
    np.fill_diagonal(similarity, 1.0)
    result = run_lorp(similarity, 2)
    assert result.options["off_diagonal_similarity"] == pytest.approx(off_diagonal)
    assert result.options["rls"] == pytest.approx(-np.log2(off_diagonal))
    assert result.options["cluster_count"] == clusters
    assert lorp.clusters_for_locality(1.0) == 2 and lorp.clusters_for_locality(0.7) == 3
    assert lorp.clusters_for_locality(0.6999) == 4 and lorp.clusters_for_locality(float("nan")) == 4


def test_records_what_lorp_saw_and_is_json_safe():
    similarity = hand_made_similarity()
    objective = MatrixObjective(similarity)
    result = lorp.search(objective, 3, seed=0, progress=False)
    options = json.loads(json.dumps(result.options))
    assert options["num_clusters"] is None and options["protect_first"] and options["protect_last"]
    assert options["cluster_count"] == 2  # RLS = 3.56: localized
    assert options["cluster_labels"] == [0, 0, 0, 0, 0, 0, 1, 1, 1, 1]
    assert options["cluster_rankings"] == [[1, 4, 2, 3, 5], [6, 7, 8]]
    np.testing.assert_array_equal(options["block_input_similarity"], similarity)
    assert objective.scored == [frozenset(result.removed_blocks)]  # one-shot: only the result is scored


def test_bad_inputs_are_one_line_errors():
    similarity = hand_made_similarity()
    with pytest.raises(UserError, match="clusters of 10"):
        run_lorp(similarity, 2, num_clusters=11)
    with pytest.raises(UserError, match="num_clusters"):
        run_lorp(similarity, 2, num_clusters=-1)
    with pytest.raises(UserError, match="protect_first"):
        run_lorp(similarity, 2, protect_first="yes")
    with pytest.raises(ValueError, match="shape"):
        lorp.search(_wrong_shape(), 2, progress=False)


def _wrong_shape():
    objective = MatrixObjective(hand_made_similarity())
    objective.num_blocks = 9
    return objective


def test_small_stacks_cap_the_rule_and_tracked_objective_notes_the_use():
    similarity = np.array(
        [[1.0, 0.9, 0.8], [0.9, 1.0, 0.85], [0.8, 0.85, 1.0]]
    )  # RLS 0.23 -> K 4, lowered to 3
    tracked = TrackedObjective(MatrixObjective(similarity))
    result = lorp.search(tracked, 1, progress=False)
    assert result.removed_blocks == (1,) and result.options["cluster_count"] == 3
    assert tracked.used_similarity


# ------------------------------------------------------------------------------------------ Streamline


def test_streamline_removes_the_most_similar_contiguous_run():
    similarity = hand_made_similarity()
    # M=2: starts 1..7; S[s, s+2] = 0.25 0.25 0.625 -0.25 -0.25 0.375 0.375 -> start 3, blocks 3 4
    result = streamline.search(MatrixObjective(similarity), 2, progress=False)
    assert result.removed_blocks == (3, 4)
    assert result.history[0]["starts"] == list(range(1, 8))
    assert result.history[0]["boundary_similarity"] == [0.25, 0.25, 0.625, -0.25, -0.25, 0.375, 0.375]
    assert result.options["start"] == 3 and result.options["boundary_similarity"] == 0.625
    # M=3: S[s, s+3] = 0.25 0.25 -0.25 -0.25 -0.25 0.375 (starts 1..6) -> start 6; block 9 is kept
    assert streamline.search(MatrixObjective(similarity), 3, progress=False).removed_blocks == (6, 7, 8)
    # ties at the top go to the first start (1 and 2 tie at 0.25, and 0 is never scored)
    flat = np.full((6, 6), 0.5)
    assert streamline.search(MatrixObjective(flat), 2, progress=False).removed_blocks == (1, 2)


def test_streamline_barrier_and_impossible_budgets():
    similarity = hand_made_similarity()
    barrier = streamline.search(MatrixObjective(similarity), 3, progress=False, latter_barrier=3)
    assert barrier.history[0]["starts"] == [1, 2, 3, 4]
    assert barrier.removed_blocks == (1, 2, 3)
    assert len(streamline.search(MatrixObjective(similarity), 8, progress=False).removed_blocks) == 8
    with pytest.raises(UserError, match="choose M <= 8"):
        streamline.search(MatrixObjective(similarity), 9, progress=False)
    with pytest.raises(UserError, match="latter_barrier"):
        streamline.search(MatrixObjective(similarity), 2, progress=False, latter_barrier=0)


# ---------------------------------------------------------------------------------- on a tiny model


@pytest.fixture(scope="module")
def demo_evaluator(demo_tiny_dir):
    config = CalibrationConfig("perplexity", f"demo:text@{demo_tiny_dir}", samples=6, seq_len=32)
    return build_evaluator(str(demo_tiny_dir), config, progress=False, batch_size=4)


def direct_similarity(model_dir, batches) -> np.ndarray:
    """S from ``output_hidden_states=True``: hidden_states[i] enters block i (the last entry is not used)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    features = []
    for batch in batches:
        with torch.no_grad():
            states = model(batch.input_ids, output_hidden_states=True, use_cache=False).hidden_states
        blocks = model.config.num_hidden_layers
        real = batch.token_mask.flatten()
        stacked = torch.stack([states[i].reshape(-1, states[i].shape[-1])[real] for i in range(blocks)])
        features.append(torch.nn.functional.normalize(stacked.double(), dim=-1))
    stacked = torch.cat(features, dim=1)
    return (torch.einsum("itd,jtd->ij", stacked, stacked) / stacked.shape[1]).numpy()


def test_similarity_is_symmetric_with_unit_diagonal_and_matches_hidden_states(demo_tiny_dir, demo_evaluator):
    similarity = demo_evaluator.block_input_similarity()
    blocks = demo_evaluator.num_blocks
    assert similarity.shape == (blocks, blocks)
    np.testing.assert_array_equal(similarity, similarity.T)
    np.testing.assert_array_equal(np.diag(similarity), 1.0)
    np.testing.assert_allclose(
        similarity, direct_similarity(demo_tiny_dir, demo_evaluator.batches), atol=1e-5
    )
    assert demo_evaluator.stats.similarity_seconds > 0
    # hidden_states[i] vs [i+1] is also what Block Influence uses: the two agree off the last block
    influence = demo_evaluator.block_influence()
    np.testing.assert_allclose(1 - np.diag(similarity, 1), influence[:-1], atol=1e-5)


def test_similarity_needs_no_forward_beyond_the_dense_pass(demo_tiny_dir):
    config = CalibrationConfig("perplexity", f"demo:text@{demo_tiny_dir}", samples=6, seq_len=32)
    evaluator = build_evaluator(str(demo_tiny_dir), config, progress=False, batch_size=4, memory_budget_gb=0)
    assert len(evaluator.boundaries) < evaluator.num_blocks  # the cache keeps only some boundaries
    forwards = evaluator.stats.block_forwards
    similarity = evaluator.block_input_similarity()
    assert evaluator.stats.block_forwards == forwards
    np.testing.assert_allclose(similarity, direct_similarity(demo_tiny_dir, evaluator.batches), atol=1e-5)


def test_similarity_leaves_padding_out_and_packing_changes_nothing(demo_tiny_dir):
    config = CalibrationConfig("task_margin", f"demo:qa@{demo_tiny_dir}", samples=5, seq_len=64)
    packed = build_evaluator(str(demo_tiny_dir), config, progress=False, batch_size=3)
    per_choice = build_evaluator(str(demo_tiny_dir), config, progress=False, batch_size=3, pack_choices=False)
    assert packed.packed and not per_choice.packed
    assert any((~batch.token_mask).any() for batch in per_choice.batches)  # choices of unequal length
    np.testing.assert_allclose(
        packed.block_input_similarity(), per_choice.block_input_similarity(), atol=1e-5
    )
    np.testing.assert_allclose(
        per_choice.block_input_similarity(), direct_similarity(demo_tiny_dir, per_choice.batches), atol=1e-5
    )


def test_lorp_and_streamline_on_the_tiny_model(demo_evaluator):
    first = lorp.search(demo_evaluator, 3, seed=0, progress=False)
    again = lorp.search(demo_evaluator, 3, seed=0, progress=False)
    assert first.removed_blocks == again.removed_blocks and first.options == again.options
    assert len(first.removed_blocks) == 3 and not {0, demo_evaluator.num_blocks - 1} & set(
        first.removed_blocks
    )
    assert first.options["cluster_count"] in (2, 3, 4)
    chosen = streamline.search(demo_evaluator, 3, progress=False).removed_blocks
    assert list(chosen) == list(range(chosen[0], chosen[0] + 3)) and chosen[0] >= 1


# ------------------------------------------------------------------------------------ the study figure


def test_study_report_draws_the_similarity_with_its_clusters(tmp_path):
    import matplotlib

    from pruning.study.cells import CellResult
    from pruning.study.figures import similarity_figure
    from pruning.study.tables import StudyView

    matplotlib.use("Agg")
    result = run_lorp(hand_made_similarity(), 3, num_clusters=4)
    checkpoint = tmp_path / "variant"
    checkpoint.mkdir()
    (checkpoint / "pruning.json").write_text(json.dumps({"scores": {"search_options": result.options}}))

    def cell(search: str) -> CellResult:
        return CellResult(
            key=search, objective="perplexity", data="demo:text", drop=3, search=search, seed=0,
            prior="single_block", removed_blocks=list(result.removed_blocks), calibration_loss=1.0,
            dense_loss=1.0, search_seconds=0.1, block_forwards=1, subset_evaluations=1, variant=None,
            checkpoint=str(checkpoint),
        )  # fmt: skip

    summary = {"seeds": [0], "searches": ["lorp", "greedy"], "drops": [3], "num_blocks": 10}
    assert similarity_figure(tmp_path, StudyView(summary, [cell("greedy")], {})) == []
    drawn = similarity_figure(tmp_path, StudyView(summary, [cell("greedy"), cell("lorp")], {}))
    assert drawn == [tmp_path / "similarity.png"] and drawn[0].stat().st_size > 0
