"""One registry shape: searches, objectives, their losses and commands are all :class:`NamedTable`s.

Each table imports an entry on first use, checks it against the interface it declares (a Protocol), keeps
its declared order, and answers an unknown name with one line listing the known ones (house style 22).
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Protocol, runtime_checkable

import pytest

from depthprune.cli.app import COMMANDS, Command
from depthprune.testing.imports import heavy_modules_loaded
from ground.core import objectives as core_objectives
from ground.core.errors import UserError
from ground.core.objectives import OBJECTIVES, Objective
from ground.core.registry_table import NamedTable, UnknownName, conforms
from pruning.calibration.objectives import LOSSES, Loss
from pruning.search import SEARCHES, STUDY_SEARCHES
from pruning.search.base import (
    Search,
    SearchOptions,
    SearchResult,
    define_search,
    flag,
    integer,
    integers,
    one_of,
)

TABLES = {"search": SEARCHES, "objective": OBJECTIVES, "loss": LOSSES, "command": COMMANDS}
INTERFACES = {"search": Search, "objective": Objective, "loss": Loss, "command": Command}


def test_searches_objectives_losses_and_commands_are_one_table_type():
    for kind, table in TABLES.items():
        assert type(table) is NamedTable, kind
        assert table.kind == kind and table.interface is INTERFACES[kind]
    import pruning.calibration.objectives as loss_package

    # The public names stay where they were, and there is one objectives table, not two.
    assert loss_package.OBJECTIVES is OBJECTIVES is core_objectives.OBJECTIVES
    assert list(LOSSES) == list(OBJECTIVES)


@pytest.mark.parametrize("kind", sorted(TABLES))
def test_every_entry_loads_and_satisfies_its_interface(kind):
    table = TABLES[kind]
    assert len(table) >= 4
    for name in table:
        assert conforms(table[name], table.interface) is None, (kind, name)
        assert table[name] is table[name]  # imported once


@pytest.mark.parametrize("kind", sorted(TABLES))
def test_unknown_name_is_one_line_listing_the_known_ones(kind):
    table = TABLES[kind]
    with pytest.raises(UserError) as raised:
        table["no-such-name"]
    message = str(raised.value)
    assert message == f"unknown {kind} 'no-such-name'; choose from {', '.join(table)}"
    assert "\n" not in message
    # Mapping code sees a KeyError: membership and .get() work as on a dict.
    assert isinstance(raised.value, UnknownName) and isinstance(raised.value, KeyError)
    assert "no-such-name" not in table and table.get("no-such-name") is None


def test_the_declared_order_is_kept():
    assert list(SEARCHES)[: len(STUDY_SEARCHES)] == list(STUDY_SEARCHES)
    assert list(OBJECTIVES) == ["perplexity", "task_margin", "task_ce", "kl"]
    assert list(COMMANDS)[:2] == ["demo-model", "checkpoint"] and list(COMMANDS)[-1] == "demo"
    table = NamedTable("thing", {"b": 2, "a": 1, "c": 3})
    assert list(table) == ["b", "a", "c"] and list(table.values()) == [2, 1, 3]


def test_naming_the_entries_imports_none_of_them():
    """Listing the searches (``--help``) imports no search module; asking for one imports that one."""
    watched = ("pruning.search.greedy", "pruning.search.bayesian", "pruning.calibration.objectives.kl")
    listing = "from pruning.search import SEARCHES; from pruning.calibration.objectives import LOSSES\n"
    listing += "assert 'greedy' in SEARCHES and list(LOSSES)"
    assert heavy_modules_loaded(listing, watched) == []
    assert heavy_modules_loaded("from pruning.search import SEARCHES; SEARCHES['greedy']", watched) == [
        "pruning.search.greedy"
    ]


def test_a_lazy_entry_is_module_colon_attribute():
    with pytest.raises(ValueError, match="'no_colon' is not 'module:attribute'"):
        NamedTable("thing", {"a": "no_colon"})
    entries = {"missing": "depthprune.no_such_module:x", "absent": "ground.core:nothing"}
    table = NamedTable("thing", entries)
    assert list(table) == ["missing", "absent"] and table.target("missing") == "depthprune.no_such_module:x"
    with pytest.raises(ModuleNotFoundError):  # a part that is not installed (build_app skips it)
        table["missing"]
    with pytest.raises(AttributeError, match="thing 'absent': module 'ground.core' has no 'nothing'"):
        table["absent"]


# Objects for the protocol checks.


@define_search(deterministic=True)
def declared_search(objective, budget, settings, seed, progress) -> SearchResult:
    """A search made by define_search."""
    return SearchResult((0,), 0.0)


def bare_search(objective, budget, *, seed=0, progress=True, **options) -> SearchResult:
    """The right signature, but none of a search's declared facts (options_class, deterministic, ...)."""
    return SearchResult((0,), 0.0)


def test_define_search_gives_the_one_signature():
    wanted = list(inspect.signature(Search.__call__).parameters.values())[1:]
    for function in (declared_search, *(SEARCHES[name] for name in SEARCHES)):
        given = list(inspect.signature(function).parameters.values())
        assert [(p.name, p.kind, p.default) for p in given] == [(p.name, p.kind, p.default) for p in wanted]
    assert declared_search.__name__ == "declared_search" and declared_search.__doc__.startswith("A search")
    assert declared_search.options_class is SearchOptions and declared_search.deterministic is True


def test_the_interface_is_checked_when_an_entry_loads():
    searches = NamedTable("search", {"good": declared_search, "bare": bare_search}, interface=Search)
    assert searches["good"] is declared_search
    absent = "check_objective, deterministic, options_class"
    with pytest.raises(TypeError, match=f"search 'bare' does not satisfy Search: it has no {absent}"):
        searches["bare"]

    def wrong_signature(objective, budget, seed=0):
        return None

    wrong_signature.options_class, wrong_signature.deterministic = SearchOptions, True
    wrong_signature.check_objective = None
    assert conforms(wrong_signature, Search) == "it takes no keyword 'progress'"
    assert conforms(lambda objective, width, *, seed=0, progress=True, **options: None, Search) == (
        "its parameter 2 is not 'budget'"
    )

    def loss(batch, hidden, head, reference=None, margin_clip=None):  # an objective parameter: a default
        return None

    def loss_without_default(batch, hidden, head, reference):
        return None

    def loss_with_a_required_extra(batch, hidden, head, reference=None, tau=None, *, scale):
        return None

    assert conforms(loss, Loss) is None
    assert conforms(loss_without_default, Loss) == "its 'reference' has no default"
    assert conforms(loss_with_a_required_extra, Loss) == "its 'scale' is required but never given"
    assert conforms("not callable", Command) == "it is not callable"
    objectives = NamedTable("objective", {"odd": {"name": "odd"}}, interface=Objective)
    with pytest.raises(
        TypeError,
        match="objective 'odd' does not satisfy Objective: it is a dict, not an instance of Objective",
    ):
        objectives["odd"]


def test_an_interface_must_be_checkable():
    class Unchecked(Protocol):
        def __call__(self) -> None: ...

    @runtime_checkable
    class Checked(Protocol):
        def __call__(self) -> None: ...

    with pytest.raises(TypeError, match="Unchecked must be @runtime_checkable"):
        NamedTable("thing", {}, interface=Unchecked)
    assert NamedTable("thing", {"f": lambda: None}, interface=Checked)["f"]() is None


def test_a_patched_entry_replaces_the_loaded_one(monkeypatch):
    """Tests patch a table as a dict (``monkeypatch.setitem``); the new entry is checked when loaded."""
    kl = OBJECTIVES["kl"]
    monkeypatch.setitem(OBJECTIVES, "kl", dataclasses.replace(kl, zero_loss_at_dense=False))
    assert OBJECTIVES["kl"].zero_loss_at_dense is False
    monkeypatch.undo()
    assert OBJECTIVES["kl"] is kl


@dataclasses.dataclass
class CheckedOptions(SearchOptions):
    count: int = integer(3)
    """A positive integer."""
    start: int | None = integer(None, minimum=0, optional=True)
    """A non-negative integer or None."""
    population: int = integer(4, minimum=2)
    """At least two."""
    steps: tuple[int, ...] = integers((1, 2))
    """Positive integers."""
    mode: str = one_of("a", ("a", "b"))
    """a or b."""
    strict: bool = flag(True)
    """True or false."""


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("count", 0, "count must be a positive integer, got 0"),
        ("count", True, "count must be a positive integer, got True"),
        ("count", 2.0, "count must be a positive integer, got 2.0"),
        ("start", -1, "start must be a non-negative integer or null, got -1"),
        ("population", 1, "population must be an integer >= 2, got 1"),
        ("steps", [], "steps must be a non-empty list of positive integers, got []"),
        ("steps", [1, 0], "steps must be a non-empty list of positive integers, got [1, 0]"),
        ("mode", "c", "mode must be one of a, b, got 'c'"),
        ("strict", "yes", "strict must be true or false, got 'yes'"),
    ],
)
def test_search_options_declare_their_checks(field, value, message):
    with pytest.raises(ValueError) as raised:
        CheckedOptions(**{field: value})
    assert str(raised.value) == message


def test_search_options_keep_valid_values():
    options = CheckedOptions(start=None, steps=5, mode="b", strict=False)
    assert dataclasses.asdict(options) == {
        "count": 3,
        "start": None,
        "population": 4,
        "steps": (5,),
        "mode": "b",
        "strict": False,
    }
