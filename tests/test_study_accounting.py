"""The study report says how search costs were measured and which blocks were protected (issue 15, fix 6/8).

Hand-made summaries and cells: the setup and the search-cost sections name the accounting of
``summary["timing"]`` (standalone on a cold memo, or marginal on a shared memo; a report from before it was
recorded is marginal) and the ``--protect`` setting with the blocks it kept.
"""

from __future__ import annotations

from pruning.study.cells import CellResult
from pruning.study.tables import build_sections


def cell(search: str, timing: str | None, protected: list[int]) -> CellResult:
    return CellResult(
        key=f"perplexity|{search}", objective="perplexity", data="c4", drop=2, search=search, seed=0,
        prior="single_block", removed_blocks=[1, 2], calibration_loss=2.5, dense_loss=2.0,
        search_seconds=3.25, block_forwards=40, subset_evaluations=6, variant=None, checkpoint=None,
        metrics={"wikitext2/perplexity": 12.0, "winogrande/acc": 0.6}, timing=timing, protected=protected,
    )  # fmt: skip


def sections_of(
    timing: str | None, protect: list[str] | None, protected: list[int], **evaluation: int | None
) -> dict:
    summary = {
        "model": "/models/tiny-llama", "num_blocks": 6, "drops": [2], "seeds": [0],
        "searches": ["one_shot", "greedy"], "calibrations": [], "suites": ["all"], "engine": "torch",
        "eval_seq_len": 64, "eval_limit": None, **evaluation,
    }  # fmt: skip
    if timing is not None:
        summary["timing"] = timing
    if protect is not None:
        summary["protect"] = protect
    cells = [cell(search, timing, protected) for search in ("one_shot", "greedy")]
    dense = {"wikitext2/perplexity": 10.0, "winogrande/acc": 0.7}
    sections, _ = build_sections(summary, cells, dense)
    return {section.title: section for section in sections}


def test_standalone_accounting_and_protected_blocks_are_stated():
    sections = sections_of("standalone", ["first", "last"], [0, 5])
    cost, setup = sections["Search cost vs accuracy"], sections["Setup"]
    for section in (cost, setup):
        text = " ".join(section.text)
        assert "Search cost accounting: standalone on a cold memo (`--timing standalone`" in text
        assert "paper's Table 4" in text and "`fast_block_select`" in text and "marginal" not in text
        assert "Protected blocks (`--protect first,last`): blocks 0, 5 are never removed" in text
    assert cost.header[3] == "seconds (standalone)"
    assert cost.rows[0][:6] == ["perplexity", "2", "one_shot", "3.2", "40", "6"]


def test_marginal_accounting_without_protection():
    sections = sections_of("shared", [], [])
    for title in ("Search cost vs accuracy", "Setup"):
        text = " ".join(sections[title].text)
        assert "Search cost accounting: marginal on a shared memo (`--timing shared`)" in text
        assert "not the paper's Table 4 accounting" in text
        assert "Protected blocks: none (`--protect` off, the paper's setting)" in text
    assert sections["Search cost vs accuracy"].header[3] == "seconds (marginal)"


def test_a_report_from_before_the_accounting_was_recorded_is_marginal():
    """Old summaries have no ``timing`` or ``protect``, old cells ``timing=None``."""
    text = " ".join(sections_of(None, None, [])["Setup"].text)
    assert "marginal on a shared memo" in text and "another accounting" not in text
    assert "Protected blocks: none" in text


def test_cells_of_another_accounting_are_named():
    sections = sections_of("shared", [], [])
    assert "another accounting" not in " ".join(sections["Setup"].text)
    summary = {
        "model": "m", "num_blocks": 6, "drops": [2], "seeds": [0], "searches": ["one_shot"],
        "calibrations": [], "suites": ["all"], "engine": "torch", "eval_seq_len": 64, "eval_limit": None,
        "timing": "shared",
    }  # fmt: skip
    built, _ = build_sections(summary, [cell("one_shot", "standalone", [])], {"wikitext2/perplexity": 10.0})
    [cost] = [section for section in built if section.title == "Search cost vs accuracy"]
    assert "Some cells were recorded under another accounting: standalone." in cost.text[0]


def test_seconds_from_several_machines_are_flagged():
    """Cells pruned on a GPU and on a CPU (registry workers on both) share a table: the cost section says
    which machine ran how many, since their seconds do not compare; one machine throughout says nothing."""
    summary = {
        "model": "m", "num_blocks": 6, "drops": [2], "seeds": [0], "searches": ["one_shot", "greedy"],
        "calibrations": [], "suites": ["all"], "engine": "torch", "eval_seq_len": 64, "eval_limit": None,
        "timing": "shared",
    }  # fmt: skip
    gpu, cpu = cell("one_shot", "shared", []), cell("greedy", "shared", [])
    gpu.search_device, cpu.search_device = "NVIDIA H100 80GB HBM3", "AMD EPYC, 2 logical cores"

    def cost_text(cells) -> str:
        built, _ = build_sections(summary, cells, {"wikitext2/perplexity": 10.0})
        return " ".join(next(s for s in built if s.title == "Search cost vs accuracy").text)

    mixed = cost_text([gpu, cpu])
    assert "ran on several machines (1 on NVIDIA H100 80GB HBM3; 1 on AMD EPYC, 2 logical cores)" in mixed
    assert "block-forwards and subsets do not depend on the machine" in mixed
    cpu.search_device = gpu.search_device
    assert "several machines" not in cost_text([gpu, cpu])
    cpu.search_device = None  # recorded before the device was kept
    assert "1 on NVIDIA H100 80GB HBM3; 1 on not recorded" in cost_text([gpu, cpu])


def test_the_setup_names_how_much_of_each_task_and_text_was_read():
    text = " ".join(sections_of("shared", [], [], eval_limit=200, eval_windows=32)["Setup"].text)
    assert (
        "perplexity windows of 64 tokens capped at the model's context, limit 200 per task, at most 32 "
        "windows per text)" in text
    )
    assert "windows per text" not in " ".join(sections_of("shared", [], [])["Setup"].text)
