"""benchmarks.bench_repair's tables: each child labelled by its parent and method, its heal seconds, and the
gap it recovered, re-rendered from a run's files without running anything."""

from __future__ import annotations

import json

from benchmarks.bench_repair import rendered


def model(label: str, baseline: bool, perplexity: float, **paired) -> dict:
    pydoc = {"perplexity": perplexity, "perplexity_ci95": [perplexity - 1, perplexity + 1], **paired}
    return {"label": label, "baseline": baseline, "tasks": {"pydoc": pydoc}}


def test_a_run_is_rendered_again_from_its_files(tmp_path):
    child = "smollm2-135m-perplexity-one-shot-m8-75e923-patch-baceef"
    (tmp_path / "eval.json").write_text(
        json.dumps(
            [
                model("dense", True, 11.19),
                model("ppl-best", False, 40.39, retention=27.7, retention_ci95=[26.2, 28.9]),
                model(child, False, 21.6, gap_recovered=0.488, gap_recovered_ci95=[0.471, 0.505]),
            ]
        )
    )
    heals = [{"parent": "ppl-best", "method": "patch", "name": child, "seconds": 316.4}]
    (tmp_path / "heals.json").write_text(json.dumps(heals))
    lines = rendered(tmp_path)
    assert "| dense | 11.19 [10.19, 12.19] | – | – | – | – |" in lines
    assert "| ppl-best | 40.39 [39.39, 41.39]; 27.7 [26.2, 28.9] % | – | – | – | – |" in lines
    assert any(line.startswith("| ppl-best + patch | 21.60 [20.60, 22.60]") and line.endswith("| 316 |")
               for line in lines)  # fmt: skip
    assert "| ppl-best + patch | 0.488 [0.471, 0.505] | – |" in lines
