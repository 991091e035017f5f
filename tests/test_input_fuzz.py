"""Property-based tests of the command line's own input: whatever bytes a data file holds and whatever a user
types into ``--suite``, ``--speculative``, ``--slo`` or a data spec, the answer is a result or a one-line
:class:`UserError` (exit 2), never a traceback (exit 1). Issue 57: a file that was not UTF-8 ended in a
55-line ``UnicodeDecodeError``.

The data readers and parsers are called directly (any exception but ``UserError`` fails); a few examples also
go through the console script, where the exit code is what a user sees.

Run: ``.venv/bin/python -m pytest tests/test_input_fuzz.py -q``
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from depthprune.testing.cli import run_cli
from ground.core.errors import UserError

FUZZ = settings(
    deadline=None,
    max_examples=150,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
CLI_FUZZ = settings(FUZZ, max_examples=10)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
# Rows near the multiple-choice schema as often as not, so the checks past the JSON parse are reached.
choice_rows = st.fixed_dictionaries(
    {},
    optional={
        "context": st.text(max_size=20) | json_values,
        "choices": st.lists(st.text(max_size=6), max_size=4) | json_values,
        "label": st.integers(-2, 5) | json_values,
        "scoring": st.sampled_from(["answer", "sentence", "other"]) | json_values,
        "text": st.text(max_size=20) | json_values,
    },
)
# A line of a data file: arbitrary bytes, a JSON value, a near-valid row, or one with escapes JSON allows.
lines = (
    st.binary(max_size=40)
    | json_values.map(lambda value: json.dumps(value).encode())
    | choice_rows.map(lambda row: json.dumps(row).encode())
    | st.sampled_from(
        [b'{"context": "\\ud800", "choices": ["a", "b"], "label": 0}', b"[" * 5000, b"\xef\xbb\xbf"]
    )
)
files = st.lists(lines, max_size=6).map(lambda parts: b"\n".join(parts))
# What people type into comma-separated options: pieces of the real syntax and anything else.
pieces = st.sampled_from(
    ["", " ", ",", ",,", "=", ":", "@", "ttft_p99_ms", "_p99.0_ms", "tpot", "=50", "s=ppl-best", ":3",
     ":1000", "text:", "mc:", "demo:text@", "offline", "all", "dense", "ünï", "\x00", "\n", "9" * 30, "nan"]
)  # fmt: skip
option_texts = st.lists(pieces | st.text(max_size=8), max_size=8).map("".join) | st.text(max_size=40)


def only_user_errors(call, *args):
    """``call(*args)``'s result, or None when it refused with a :class:`UserError` in one line."""
    try:
        return call(*args)
    except UserError as error:
        assert "\n" not in str(error).strip() or "log ends" in str(error), str(error)
        return None


@pytest.mark.parametrize("suffix", [".txt", ".jsonl"])
@FUZZ
@given(content=files)
def test_any_bytes_in_a_data_file_are_read_or_refused_in_one_line(tmp_path, suffix, content):
    from pruning.calibration.data.local import read_choice_file, read_jsonl, read_text_file
    from pruning.evaluation.user_suites import read_user_task

    path = tmp_path / f"data{suffix}"
    path.write_bytes(content)
    only_user_errors(read_text_file, path)
    only_user_errors(read_jsonl, path)
    only_user_errors(read_choice_file, path)
    for kind in ("text", "mc"):
        task = only_user_errors(read_user_task, f"{kind}:{path}")
        if task is not None and kind == "mc":
            from pruning.evaluation.user_suites import check_item_bytes

            only_user_errors(check_item_bytes, [task], 4)


@FUZZ
@given(text=option_texts)
def test_any_option_text_is_parsed_or_refused_in_one_line(text):
    from loadtest.slo import parse_slo
    from pruning.calibration.data.specs import parse_spec
    from pruning.cli.groups import suite_list
    from pruning.evaluation.suites import EvalSettings
    from server.speculative import parse_speculative

    slo = only_user_errors(parse_slo, text)
    if slo is not None:
        assert len({objective.name for objective in slo.objectives}) == len(slo.objectives)
    arms = only_user_errors(parse_speculative, text)
    for arm in arms or []:
        assert 1 <= arm.num_speculative_tokens <= 32 and arm.name.isascii()
    only_user_errors(parse_spec, text)
    suites = only_user_errors(suite_list, text)
    if suites is not None:
        assert all(suites)
        only_user_errors(lambda: EvalSettings(suites=suites, engine="torch"))


@CLI_FUZZ
@given(text=option_texts)
@example(text="s=ppl-best")  # a valid arm's syntax: refused only because the draft is nowhere to be found
def test_the_console_script_never_exits_1_on_option_text(tmp_path, text):
    code, _, err = run_cli("eval", f"dense@{tmp_path / 'none'}", "--suite", text, "--no-record")
    assert code == 2 and err.startswith("error: "), (code, err)
    # An empty registry of its own: in the session's, another test's ppl-best makes "s=ppl-best" a valid arm,
    # and serve then served it, holding the worker for good (a whole-suite run hung on it, 2026-11-28)
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    code, _, err = run_cli(
        "serve", "--variants", "x=http://127.0.0.1:9", "--registry", empty, "--speculative", text or ","
    )
    assert code == 2 and err.startswith("error: "), (code, err)


@CLI_FUZZ
@given(content=files)
def test_the_console_script_never_exits_1_on_a_data_file(tmp_path, tiny_model_dirs, content):
    path = Path(tmp_path) / "data.jsonl"
    path.write_bytes(content)
    model = tiny_model_dirs("llama")
    code, _, err = run_cli(
        "eval", model, "--suite", f"mc:{path}", "--engine", "torch", "--no-record", "--json"
    )
    assert code == 0 or (code == 2 and err.startswith("error: ") and err.count("\n") == 1), (code, err)
