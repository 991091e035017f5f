"""The demo load-tests one of the variants that keep as many blocks of each kind (the same computation)."""

from __future__ import annotations

from depthprune.cli.demo_table import speed_notes
from depthprune.cli.demo_twins import SPEED_TWIN_REASON, kept_kinds, speed_twins


def test_variants_keeping_as_many_blocks_of_each_kind_are_twins():
    removed = {"ppl-best": [3, 4, 5], "ce-best": [0, 7, 9], "other": [1, 2]}
    assert speed_twins(removed, 10) == {"ce-best": "ppl-best"}  # "other" keeps 8, not 7


def test_sliding_and_full_attention_blocks_are_different_kinds():
    layer_types = ["sliding_attention"] * 5 + ["full_attention"]
    assert kept_kinds([0], 6, layer_types) == (("full_attention", 1), ("sliding_attention", 4))
    removed = {"a": [0], "b": [5], "c": [2]}
    assert speed_twins(removed, 6, layer_types) == {"c": "a"}  # b drops the one full-attention block


def test_a_twin_is_named_in_the_notes_with_its_reason():
    rows = [
        {"variant": "ppl-best"},
        {"variant": "ce-best", "speed_of": "ppl-best", "speed_because": SPEED_TWIN_REASON},
        {"variant": "ppl-best+patch", "speed_of": "ppl-best"},
    ]
    twin, patched = speed_notes(rows)
    assert twin == (
        "ce-best: not load-tested; its speed is ppl-best's by construction (the same number and kinds of "
        "blocks kept: the same computation per token)."
    )
    assert patched.startswith("ppl-best+patch: not load-tested") and "folded into existing weights" in patched
