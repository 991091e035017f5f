"""One registry shape for every table of named things: searches, objectives, their losses, commands.

A :class:`NamedTable` maps a name to an object, given either as the object itself or as the text
``"module:attribute"``, imported on first use (so listing the names, ``--help`` for one, never imports the
others), as lm-evaluation-harness's ``lm_eval/api/registry.py`` does. Each table declares the interface its
objects satisfy, a ``typing.Protocol`` (``Search``, ``Loss``, ``Command``) or a class, checked when an
object is loaded; its names keep the order they were declared in; an unknown name is one line listing the
known ones::

    SEARCHES = NamedTable("search", {"greedy": "pruning.search.greedy:search", ...}, interface=Search)
    SEARCHES["greedy"]      # imports pruning.search.greedy, checks it against Search, keeps it
    SEARCHES["gredy"]       # UnknownName: unknown search 'gredy'; choose from one_shot, greedy, ...

(The name ``registry`` belongs to the variant database, ``registry/``.)
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterator, Mapping
from typing import Generic, Protocol, TypeVar

from ground.core.errors import UserError

T = TypeVar("T")

EMPTY = inspect.Parameter.empty
POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
KEYWORD_ONLY, VAR_POSITIONAL, VAR_KEYWORD = (
    inspect.Parameter.KEYWORD_ONLY,
    inspect.Parameter.VAR_POSITIONAL,
    inspect.Parameter.VAR_KEYWORD,
)

__all__ = ["NamedTable", "UnknownName", "conforms"]


class UnknownName(UserError, KeyError):
    """A name no table entry has: a one-line :class:`UserError` for the user, a ``KeyError`` for mapping code
    (``name in table``, ``table.get(name)``)."""

    def __str__(self) -> str:
        # KeyError's own str() would quote the message.
        return str(self.args[0]) if self.args else ""


def _is_target(entry: object) -> bool:
    return isinstance(entry, str)


def _split_target(kind: str, name: str, target: str) -> tuple[str, str]:
    module, separator, attribute = target.partition(":")
    if not (separator and module and attribute.isidentifier()):
        raise ValueError(f"{kind} {name!r}: {target!r} is not 'module:attribute'")
    return module, attribute


def _call_mismatch(interface: type, target: object) -> str | None:
    """Why ``target`` cannot be called every way ``interface.__call__`` can (None when it can).

    Each positional parameter of the interface must stand at the same place under the same name, each
    keyword-only one be accepted by name, a default stay a default, ``*args`` / ``**kwargs`` be taken too;
    any further parameter of the target needs a default. ``__call__(self, *args, **kwargs)`` accepts any
    callable.
    """
    if not callable(target):
        return "it is not callable"
    wanted = list(inspect.signature(interface.__call__).parameters.values())[1:]  # without self
    if [parameter.kind for parameter in wanted] == [VAR_POSITIONAL, VAR_KEYWORD]:
        return None
    try:
        given = list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):
        return None  # a builtin without a signature: nothing to compare
    by_name = {parameter.name: parameter for parameter in given}
    for index, parameter in enumerate(wanted):
        if parameter.kind in POSITIONAL:
            match = given[index] if index < len(given) else None
            if match is None or match.kind not in POSITIONAL or match.name != parameter.name:
                return f"its parameter {index + 1} is not {parameter.name!r}"
        elif parameter.kind is KEYWORD_ONLY:
            match = by_name.get(parameter.name)
            if match is None or match.kind is inspect.Parameter.POSITIONAL_ONLY:
                return f"it takes no keyword {parameter.name!r}"
        else:
            match = next((other for other in given if other.kind is parameter.kind), None)
            if match is None:
                return f"it takes no {'*args' if parameter.kind is VAR_POSITIONAL else '**kwargs'}"
        if parameter.default is not EMPTY and match.default is EMPTY:
            return f"its {match.name!r} has no default"
    names = {parameter.name for parameter in wanted}
    for parameter in given:
        free = parameter.kind in (VAR_POSITIONAL, VAR_KEYWORD) or parameter.default is not EMPTY
        if not free and parameter.name not in names:
            return f"its {parameter.name!r} is required but never given"
    return None


def _declares_call(interface: type) -> bool:
    return any("__call__" in vars(base) for base in interface.__mro__ if base not in (object, Generic))


def _members(interface: type) -> list[str]:
    """The attributes and public methods a Protocol declares."""
    names: set[str] = set()
    for base in interface.__mro__:
        if base in (object, Generic, Protocol):
            continue
        names |= set(vars(base).get("__annotations__", {}))
        names |= {name for name, value in vars(base).items() if callable(value) and not name.startswith("_")}
    return sorted(names)


def conforms(target: object, interface: type) -> str | None:
    """Why ``target`` does not satisfy ``interface`` (None when it does).

    Args:
        target: the loaded object.
        interface: a ``@runtime_checkable`` Protocol (its members are checked by ``isinstance``, and a
            ``__call__`` of it against the object's signature) or a class (``isinstance``).

    Returns:
        A short reason, or None.
    """
    if getattr(interface, "_is_protocol", False):
        if _declares_call(interface):
            reason = _call_mismatch(interface, target)
            if reason:
                return reason
        absent = [name for name in _members(interface) if not hasattr(target, name)]
        if absent or not isinstance(target, interface):
            return f"it has no {', '.join(absent) or 'member of ' + interface.__name__}"
        return None
    if not isinstance(target, interface):
        return f"it is a {type(target).__name__}, not an instance of {interface.__name__}"
    return None


class NamedTable(Mapping, Generic[T]):
    """Name -> object, each object given as itself or as ``"module:attribute"`` (imported on first use).

    A mapping in the declared order: ``name in table`` and ``list(table)`` import nothing;
    ``table[name]`` imports the object once, checks it against ``interface``, and answers an unknown name
    with :class:`UnknownName`. ``table[name] = value`` replaces or adds one entry (tests patch it so).

    Args:
        kind: what one entry is, for messages: ``"search"``, ``"objective"``, ``"command"``.
        entries: name -> object or ``"module:attribute"``, in the order the table lists them.
        interface: the Protocol (``@runtime_checkable``) or class every object satisfies; None, any.
    """

    def __init__(self, kind: str, entries: Mapping[str, T | str], *, interface: type | None = None):
        if interface is not None and getattr(interface, "_is_protocol", False):
            if not getattr(interface, "_is_runtime_protocol", False):
                raise TypeError(f"{interface.__name__} must be @runtime_checkable to check {kind} entries")
        self.kind = kind
        self.interface = interface
        self._entries: dict[str, T | str] = {}
        self._loaded: dict[str, T] = {}
        for name, entry in entries.items():
            self[name] = entry

    def __setitem__(self, name: str, entry: T | str) -> None:
        if _is_target(entry):
            _split_target(self.kind, name, entry)
        self._entries[name] = entry
        self._loaded.pop(name, None)

    def __delitem__(self, name: str) -> None:
        del self._entries[name]
        self._loaded.pop(name, None)

    def __getitem__(self, name: str) -> T:
        if name in self._loaded:
            return self._loaded[name]
        if name not in self._entries:
            raise UnknownName(self.unknown(name))
        entry = self._entries[name]
        loaded = self._import(name, entry) if _is_target(entry) else entry
        if self.interface is not None:
            reason = conforms(loaded, self.interface)
            if reason:
                where = f" ({entry})" if _is_target(entry) else ""
                raise TypeError(
                    f"{self.kind} {name!r}{where} does not satisfy {self.interface.__name__}: {reason}"
                )
        self._loaded[name] = loaded
        return loaded

    def _import(self, name: str, target: str) -> T:
        module_name, attribute = _split_target(self.kind, name, target)
        module = importlib.import_module(module_name)  # ModuleNotFoundError: that part is not installed
        try:
            return getattr(module, attribute)
        except AttributeError:
            raise AttributeError(
                f"{self.kind} {name!r}: module {module_name!r} has no {attribute!r}"
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def unknown(self, name: str) -> str:
        """The one-line message for a name the table lacks: ``unknown search 'x'; choose from a, b``."""
        return f"unknown {self.kind} {name!r}; choose from {', '.join(self._entries) or 'none'}"

    def target(self, name: str) -> str | None:
        """The ``"module:attribute"`` an entry names (without importing it); None for an object given as
        itself.

        Raises:
            UnknownName: no entry ``name``.
        """
        if name not in self._entries:
            raise UnknownName(self.unknown(name))
        entry = self._entries[name]
        return entry if _is_target(entry) else None

    def __repr__(self) -> str:
        return f"NamedTable({self.kind!r}, [{', '.join(self._entries)}])"
