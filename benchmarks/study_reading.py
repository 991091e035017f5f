"""A study's reading, generated from its report's ``study.json`` (:mod:`pruning.study.reading`).

    .venv/bin/python -m benchmarks.study_reading docs/study-smollm2-135m \\
        --cross docs/study-smollm2-135m/cross-controls              # print the reading
    .venv/bin/python -m benchmarks.study_reading docs/study-smollm2-135m \\
        --cross docs/study-smollm2-135m/cross-controls --write      # write reading.md, re-render the report
    (--size DIR adds the calibration-size arm: the task objectives with more calibration questions;
    --arm DIR, repeatable, an arm whose §5.2 ratio the audit's paragraphs give beside the study's;
    --prose docs/study.md rewrites that file's generated paragraph of the study's figures)

Every number the reading compares with the paper is computed like for like (the paper's seven searches, its
budgets by fraction of blocks, means with means, per-cell statistics next to pooled ones); extensions and
disagreements are labelled. ``--write`` writes ``reading.md`` and re-renders ``README.md`` and ``report.html``
around it (figures and ``study.json`` untouched).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ground.core.errors import UserError
from pruning.study.reading import reading_facts, render_reading, write_reading


def jsonable(value):
    """``value`` with every tuple dict key joined into a string (the facts key some tables by tuples)."""
    if isinstance(value, dict):
        return {
            " | ".join(map(str, key)) if isinstance(key, tuple) else key: jsonable(item)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [jsonable(item) for item in value]
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="study report directory (with study.json)")
    parser.add_argument("--cross", type=Path, help="the cross-controls' report directory, if any")
    parser.add_argument("--size", type=Path, help="the calibration-size arm's report directory, if any")
    parser.add_argument(
        "--arm", type=Path, action="append", default=[], help="an arm for the audit's §5.2 ratio (repeatable)"
    )
    parser.add_argument(
        "--prose", type=Path, help="rewrite this Markdown file's generated study paragraph (docs/study.md)"
    )
    parser.add_argument("--write", action="store_true", help="write reading.md and re-render the report")
    parser.add_argument("--facts", action="store_true", help="print the numbers as JSON instead")
    arguments = parser.parse_args()
    try:
        if arguments.prose:
            from pruning.study.prose import write_prose

            study = json.loads((arguments.report / "study.json").read_text())
            size = json.loads((arguments.size / "study.json").read_text()) if arguments.size else None
            arms = [json.loads((arm / "study.json").read_text()) for arm in arguments.arm]
            write_prose(arguments.prose, study, reading_facts(study, None, size, arms))
            print(f"rewrote the generated paragraph of {arguments.prose}")
            return
        if arguments.write:
            write_reading(arguments.report, arguments.cross, arguments.size, arguments.arm)
            print(f"wrote {arguments.report / 'reading.md'} and re-rendered README.md, report.html")
            return
        study = json.loads((arguments.report / "study.json").read_text())
        cross = json.loads((arguments.cross / "study.json").read_text()) if arguments.cross else None
        size = json.loads((arguments.size / "study.json").read_text()) if arguments.size else None
        arms = [json.loads((arm / "study.json").read_text()) for arm in arguments.arm]
        facts = reading_facts(study, cross, size, arms)
        if arguments.facts:
            print(json.dumps(jsonable(facts), indent=1, default=str))
        else:
            print(render_reading(facts))
    except (UserError, FileNotFoundError) as error:
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    main()
