"""The command lines of ``study`` and ``prune`` build the configurations the issue asks for (nothing runs)."""

from __future__ import annotations

import pytest

from pruning.search import STUDY_SEARCHES
from pruning.study.plan import STUDY_BASELINES


@pytest.fixture
def configs(monkeypatch):
    """The StudyConfig each ``study`` call would run, instead of running it."""
    import pruning.study.run as run

    seen = []

    def capture(config):
        seen.append(config)
        return config.out

    monkeypatch.setattr(run, "run_study", capture)
    return seen


@pytest.mark.parametrize(
    ("searches", "expected"),
    [
        (None, STUDY_SEARCHES),
        ("study", STUDY_SEARCHES),
        ("all", STUDY_SEARCHES + STUDY_BASELINES),
        ("greedy,study,evolution", ("greedy", *(s for s in STUDY_SEARCHES if s != "greedy"), "evolution")),
    ],
)
def test_searches_study_is_the_papers_seven_and_all_adds_the_baselines(
    run_cli, configs, tmp_path, searches, expected
):
    arguments = ["study", "--model", "m", "--drop", "2", "--out", str(tmp_path)]
    code, _, err = run_cli(*arguments, *(["--searches", searches] if searches else []))
    assert code == 0, err
    assert configs[-1].searches == expected


def test_worker_options_reach_the_config(run_cli, configs, tmp_path):
    code, _, err = run_cli(
        "study", "--model", "m", "--drop", "2", "--out", str(tmp_path), "--worker", "--lease-seconds", "7.5"
    )
    assert code == 0, err
    assert (configs[-1].worker, configs[-1].lease_seconds) == (True, 7.5)
    assert (configs[-1].timing, configs[-1].protect) == ("standalone", ())
    code, _, err = run_cli("study", "--model", "m", "--drop", "2", "--lease-seconds", "0")
    assert code == 2 and "--lease-seconds must be positive" in err


def test_sampling_reaches_the_calibration_of_study_and_prune(run_cli, configs, tmp_path):
    code, _, err = run_cli(
        "study", "--model", "m", "--drop", "2", "--out", str(tmp_path), "--sampling", "stream"
    )
    assert code == 0, err
    assert configs[-1].sampling == "stream"
    code, _, err = run_cli(
        "prune", "--model", "m", "--objective", "perplexity", "--data", "c4", "--drop", "2",
        "--sampling", "windows",
    )  # fmt: skip
    assert code == 2 and "unknown sampling 'windows'" in err


def test_data_seed_and_choice_seq_len_reach_the_config(run_cli, configs, tmp_path):
    arguments = ["study", "--model", "m", "--drop", "2", "--out", str(tmp_path), "--seeds", "0,1"]
    code, _, err = run_cli(*arguments)
    assert code == 0, err
    assert (configs[-1].data_seed, configs[-1].choice_seq_len) == (None, None)  # each seed draws its own
    code, _, err = run_cli(*arguments, "--data-seed", "4", "--choice-seq-len", "128")
    assert code == 0, err
    assert (configs[-1].data_seed, configs[-1].choice_seq_len) == (4, 128)
    code, _, err = run_cli(*arguments, "--data-seed", "-1")
    assert code == 2 and "--data-seed needs a non-negative integer" in err
