"""The committed online-quality record (docs/online-quality/, issue 53 item 6) recomputed from its JSON alone.

Every look's verdicts and sequences are computed again from the sufficient statistics the look recorded
(``server.experiment_comparison.compare_arms``), the first decisions from the looks, the shadow's TPOT cost
from the blocks' moments, the online/offline order from the final look and the offline yardstick, and the
tables docs/benchmarks.md shows from the record: a number edited by hand, or a reading that no longer
follows from the data, fails here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks.online_quality_reading import first_decisions, markdown, order_comparison, phase_cost
from server.experiment_comparison import compare_arms
from server.sequential import Moments

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "docs" / "online-quality" / "smollm2-135m.json"
BENCHMARKS_MD = ROOT / "docs" / "benchmarks.md"


@pytest.fixture(scope="module")
def record() -> dict:
    return json.loads(RECORD.read_text())


def _close(a, b) -> bool:
    """Equal, floats to 1e-9 relative (JSON round trip), recursively."""
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[key], b[key]) for key in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def recomputed_look(look: dict) -> dict:
    """``vs_control`` of every arm from the look's moments, as the gateway's report computed it."""
    moments = {
        arm: {measure: Moments(**values) for measure, values in measures.items()}
        for arm, measures in look["moments"].items()
    }
    rows = compare_arms(moments, list(look["moments"]), look["control"], look["margin"])
    return {arm: row["vs_control"] for arm, row in rows.items() if "vs_control" in row}


def _without_guardrail(arms: dict) -> dict:
    return {arm: {k: v for k, v in row.items() if k != "guardrail"} for arm, row in arms.items()}


def test_every_look_follows_from_its_moments(record):
    looks = [look for domain in record["domains"].values() for look in domain["looks"]]
    assert looks and all("moments" in look for look in looks)
    for look in looks:
        assert _close(recomputed_look(look), _without_guardrail(look["arms"])), look["look"]


def test_the_first_decisions_follow_from_the_looks(record):
    arms = [record["arms"]["aa"], *record["arms"]["variants"]]
    for domain in record["domains"].values():
        for arm in arms:
            assert first_decisions(domain["looks"], arm) == domain["first_decisions"][arm]


def _cumulative(blocks: list[dict], phase: str) -> list[dict]:
    """After each block of ``phase``: per arm and measure, the moments of that phase's blocks so far."""
    totals: dict = {}
    after = []
    for block in blocks:
        if block["phase"] != phase:
            continue
        for arm, measures in block["moments"].items():
            for measure, values in measures.items():
                then = totals.setdefault(arm, {}).get(measure, Moments())
                totals[arm][measure] = then + Moments(**values)
        after.append({arm: dict(measures) for arm, measures in totals.items()})
    return after


def test_the_off_phase_verdicts_follow_from_the_blocks(record):
    """The shadow-off experiment's looks, rebuilt from its blocks' moments: its last look is the recorded
    off-phase report, and its first speed decisions are the recorded ones."""
    control, margin = record["arms"]["control"], record["off_phase"]["margin"]
    looks = []
    for number, moments in enumerate(_cumulative(record["blocks"], "off"), start=1):
        latencies = {
            arm: {m: v for m, v in measures.items() if m in ("tpot", "e2el")}
            for arm, measures in moments.items()
        }
        rows = compare_arms(latencies, list(latencies), control, margin)
        arms = {arm: row["vs_control"] for arm, row in rows.items() if "vs_control" in row}
        answered = {arm: int(measures["tpot"].count) for arm, measures in moments.items()}
        looks.append({"look": number, "scored": {}, "answered": answered, "arms": arms})
    final = {arm["name"]: arm["vs_control"] for arm in record["off_phase"]["arms"] if "vs_control" in arm}
    for arm, versus in looks[-1]["arms"].items():
        for key in ("tpot_ratio", "tpot_ratio_cs95", "e2el_ratio", "e2el_ratio_cs95", "speed"):
            assert _close(versus[key], final[arm][key]), (arm, key)
    for arm, decided in record["off_first_decisions"].items():
        assert first_decisions(looks, arm)["speed"] == decided


def test_the_looks_add_up_the_blocks(record):
    """Each shadow-on look's moments are the sum of the on blocks before it (both domains' experiments)."""
    cumulative = _cumulative(record["blocks"], "on")
    for index, after in enumerate(cumulative):
        for arm, measures in after.items():
            for measure in ("tpot", "dense_nll"):
                summed = sum(
                    (
                        Moments(**domain["looks"][index]["moments"][arm][measure])
                        for domain in record["domains"].values()
                    ),
                    Moments(),
                )
                assert math.isclose(summed.count, measures[measure].count), (index, arm, measure)
                assert math.isclose(summed.total, measures[measure].total, rel_tol=1e-9), (
                    index,
                    arm,
                    measure,
                )


def test_the_shadow_cost_follows_from_the_blocks(record):
    for arm, measures in record["shadow_cost"].items():
        for measure, cost in measures.items():
            assert _close(phase_cost(record["blocks"], arm, measure), cost), (arm, measure)


def test_the_online_order_follows_from_the_final_look_and_the_yardstick(record):
    offline = record["offline"]
    for domain in record["domains"].values():
        online = _without_guardrail(domain["looks"][-1]["arms"])
        for task, order in domain["order"].items():
            yardstick = {arm: offline[arm][task] for arm in online if task in offline.get(arm, {})}
            assert order_comparison(online, yardstick) == order


def test_the_docs_show_the_record_as_it_is(record):
    text = BENCHMARKS_MD.read_text()
    for line in markdown(record).splitlines():
        if line.startswith("|"):
            assert line in text, line
