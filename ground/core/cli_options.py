"""Command-line options made from dataclass fields: each option is declared once, on the dataclass it fills.

As vLLM's ``EngineArgs.add_cli_args`` / ``from_cli_args``: a field becomes ``--kebab-name``, its type the
option's type, its default the option's default, its attribute docstring the option's help. A command is a
plain function whose parameters are annotated with such dataclasses; :func:`with_options` gives typer the
expanded signature (one ``typer.Option`` per field, made here and nowhere else) and hands the function the
dataclasses built from what was parsed. Example::

    @option_group
    @dataclass(frozen=True)
    class ListOptions:
        base: str | None = None
        \"\"\"Only the variants of this base model.\"\"\"

    @with_options
    def list_command(options: ListOptions, registry: RegistryOptions, output: JsonOptions) -> None: ...

Two kinds of dataclass take part:

* an *option group* (:func:`option_group`): every field is an option; the command receives the instance;
* a *config* (``LoadConfig``, ``HealConfig``, ...): only the fields whose metadata says :func:`cli` are
  options. The command receives the instance (annotation ``LoadConfig``) or, where it adds values of its own
  before building it, the parsed values (annotation ``OptionValues[HealConfig]``), which
  :func:`config_from_options` turns into the config.

Where the command line differs from the field, :func:`cli` says how: other flags or Python name, the command
line's own type and default, a ``parse`` from the typed value to the field's, the help when the docstring
cannot serve, ``metavar``, ``min``, ``envvar``, ``hidden``. One command may change a group's help or
default for itself: ``Annotated[JsonOptions, Override(as_json="Print one JSON line per variant.")]``.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import sys
import textwrap
import typing
from collections.abc import Callable, Mapping
from typing import Annotated, Any

__all__ = [
    "UNSET",
    "CliField",
    "OptionValues",
    "Override",
    "cli",
    "config_from_options",
    "field_docstrings",
    "option_arguments",
    "option_group",
    "option_specs",
    "unset_if_none",
    "with_options",
]

METADATA_KEY = "cli"
"""The key of a field's metadata that holds its :class:`CliField`."""

UNSET = object()
"""What a ``parse`` returns to leave the field at its dataclass default (see :func:`unset_if_none`)."""

_REQUIRED = inspect.Parameter.empty


def unset_if_none(value: Any) -> Any:
    """A ``parse`` for an option whose absence (None) means the field's own default (a default factory)."""
    return UNSET if value is None else value


@dataclasses.dataclass(frozen=True)
class CliField:
    """How one dataclass field appears on the command line, where that differs from the field itself."""

    flags: tuple[str, ...] = ()
    """Option names (``("--json",)``, ``("--option", "-o")``, ``("--shortcuts/--no-shortcuts",)``); empty =
    ``--`` and the Python name in kebab case."""
    name: str | None = None
    """The Python parameter name (and so the flag, when ``flags`` is empty); None = the field's name."""
    help: str | None = None
    """The help text; None = the field's attribute docstring, its whitespace collapsed."""
    type: Any = _REQUIRED
    """The type typer parses (``str | None``); unset = the field's annotation."""
    default: Any = _REQUIRED
    """The command line's default; unset = the field's default (no default: a required option)."""
    parse: Callable[[Any], Any] | None = None
    """The typed value -> the field's value (``"inf"`` -> ``math.inf``); may return :data:`UNSET`."""
    metavar: str | None = None
    """The value's name in the help (``URL``, ``K``)."""
    min: float | None = None
    """The smallest value typer accepts."""
    envvar: str | None = None
    """An environment variable that gives the value when the option is absent."""
    hidden: bool = False
    """Leave the option out of ``--help``."""


def cli(*flags: str, **settings: Any) -> dict[str, CliField]:
    """Field metadata that makes the field an option: ``field(default=..., metadata=cli("--json"))``.

    ``settings`` are the other :class:`CliField` attributes (``help=``, ``name=``, ``type=``, ...).
    """
    return {METADATA_KEY: CliField(flags=tuple(flags), **settings)}


def option_group(cls: type) -> type:
    """Mark a dataclass whose every field is a command-line option (no :func:`cli` metadata needed)."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} must be a dataclass (put @option_group above @dataclass)")
    cls.__option_group__ = True
    return cls


class Override:
    """One command's changes to the options of a group it shares: ``Override(as_json="Print ...")`` (a help
    text) or ``Override(timing={"default": "standalone"})`` (any :class:`CliField` attributes but ``parse``).
    Used as ``Annotated[GroupClass, Override(...)]``."""

    def __init__(self, **changes: str | Mapping[str, Any]) -> None:
        self.changes = {
            field: {"help": change} if isinstance(change, str) else dict(change)
            for field, change in changes.items()
        }
        for field, change in self.changes.items():
            unknown = set(change) - {f.name for f in dataclasses.fields(CliField)} | ({"parse"} & set(change))
            if unknown:
                raise TypeError(f"Override({field}=...): cannot change {', '.join(sorted(unknown))}")

    def __repr__(self) -> str:
        return f"Override({self.changes!r})"


class _ValuesOf:
    """The marker inside ``OptionValues[Config]``."""

    def __init__(self, config: type) -> None:
        self.config = config

    def __repr__(self) -> str:
        return f"OptionValues[{self.config.__name__}]"


class OptionValues(dict):
    """``OptionValues[Config]``, as a command's annotation: the options of ``Config``'s fields, handed to the
    command as ``{field name: typed value}``; :func:`config_from_options` builds ``Config`` from them."""

    def __class_getitem__(cls, config: type) -> Any:
        return Annotated[dict, _ValuesOf(config)]


# ------------------------------------------------------------------------------------------ the fields


@functools.cache
def field_docstrings(cls: type) -> dict[str, str]:
    """``{field: docstring}``: the string literal right after each annotated attribute of ``cls`` and of
    the dataclasses it derives from (parsed once with :mod:`ast`), whitespace collapsed to single spaces."""
    docstrings: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):  # defined where there is no source (an interactive session)
            continue
        body = ast.parse(source).body[0].body
        for statement, following in zip(body, body[1:], strict=False):
            if (
                isinstance(statement, ast.AnnAssign)
                and isinstance(statement.target, ast.Name)
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                docstrings[statement.target.id] = " ".join(following.value.value.split())
    return docstrings


def _field_type(cls: type, field: dataclasses.Field) -> Any:
    """The field's annotation as an object (a string annotation evaluated where the field was declared)."""
    if not isinstance(field.type, str):
        return field.type
    owner = next(klass for klass in cls.__mro__ if field.name in getattr(klass, "__annotations__", {}))
    namespace = dict(vars(sys.modules[owner.__module__]))
    try:
        return eval(field.type, namespace)  # noqa: S307 - the annotation as written in our own source
    except NameError as error:
        raise TypeError(
            f"{cls.__name__}.{field.name}: cannot evaluate its annotation {field.type!r} ({error}); give "
            "cli(type=...)"
        ) from None


@dataclasses.dataclass(frozen=True)
class OptionSpec:
    """One command-line option made from one field: everything typer needs, and how to fill the field."""

    field: str
    """The dataclass field it fills."""
    name: str
    """The Python parameter name typer passes it by."""
    type: Any
    """The type typer parses."""
    default: Any
    """Its default; ``inspect.Parameter.empty`` for a required option."""
    help: str | None
    """Its help text."""
    settings: CliField
    """Flags, metavar, min, envvar, hidden and parse, as declared."""

    def parameter(self) -> inspect.Parameter:
        """The keyword-only parameter of a typer signature that declares this option."""
        import typer

        info = self.settings
        option = typer.Option(
            *info.flags,
            help=self.help,
            metavar=info.metavar,
            min=info.min,
            envvar=info.envvar,
            hidden=info.hidden,
        )
        return inspect.Parameter(
            self.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=self.default,
            annotation=Annotated[self.type, option],
        )


def _is_group(cls: type) -> bool:
    return bool(cls.__dict__.get("__option_group__"))


@functools.cache
def option_specs(cls: type) -> tuple[OptionSpec, ...]:
    """The options of ``cls``'s fields, in field order: every field of an option group, the fields with
    :func:`cli` metadata of any other dataclass."""
    docstrings = field_docstrings(cls)
    specs = []
    for field in dataclasses.fields(cls):
        settings = field.metadata.get(METADATA_KEY)
        if settings is None:
            if not _is_group(cls):
                continue
            settings = CliField()
        if settings.default is not _REQUIRED:
            default = settings.default
        elif field.default is not dataclasses.MISSING:
            default = field.default
        elif field.default_factory is not dataclasses.MISSING:
            raise TypeError(f"{cls.__name__}.{field.name}: a default factory needs cli(default=...)")
        else:
            default = _REQUIRED
        help_text = settings.help if settings.help is not None else docstrings.get(field.name)
        if help_text is None:
            raise TypeError(f"{cls.__name__}.{field.name}: an option needs a docstring or cli(help=...)")
        specs.append(
            OptionSpec(
                field=field.name,
                name=settings.name or field.name,
                type=settings.type if settings.type is not _REQUIRED else _field_type(cls, field),
                default=default,
                help=help_text,
                settings=settings,
            )
        )
    return tuple(specs)


def _overridden(
    specs: tuple[OptionSpec, ...], override: Override | None, owner: type
) -> tuple[OptionSpec, ...]:
    """``specs`` with one command's :class:`Override` applied."""
    if override is None:
        return specs
    by_field = {spec.field: spec for spec in specs}
    unknown = set(override.changes) - set(by_field)
    if unknown:
        raise TypeError(f"Override of {owner.__name__}: no option {', '.join(sorted(unknown))}")
    changed = []
    for spec in specs:
        change = dict(override.changes.get(spec.field, {}))
        if not change:
            changed.append(spec)
            continue
        top = {key: change.pop(key) for key in ("help", "default", "type", "name") if key in change}
        changed.append(
            dataclasses.replace(spec, **top, settings=dataclasses.replace(spec.settings, **change))
        )
    return tuple(changed)


def option_arguments(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """``{field: value}`` of the options of ``cls`` found in ``values`` (typed values by field name), each
    through its ``parse``; a parse that returns :data:`UNSET` leaves its field out."""
    arguments = {}
    for spec in option_specs(cls):
        if spec.field not in values:
            continue
        value = values[spec.field]
        if spec.settings.parse is not None:
            value = spec.settings.parse(value)
        if value is not UNSET:
            arguments[spec.field] = value
    return arguments


def config_from_options(cls: type, values: Mapping[str, Any], /, **fields: Any) -> Any:
    """``cls`` built from the typed option values of its fields (``values``, as ``OptionValues[cls]`` holds
    them) and ``fields``, values the command adds (already the fields' own; they win)."""
    return cls(**{**option_arguments(cls, values), **fields})


# --------------------------------------------------------------------------------------------- commands


@dataclasses.dataclass(frozen=True)
class _Group:
    """One parameter of a command that stands for a dataclass's options."""

    parameter: str
    cls: type
    as_values: bool
    specs: tuple[OptionSpec, ...]


def _group_of(name: str, hint: Any) -> _Group | None:
    """The group a parameter's annotation names (``Cls``, ``Annotated[Cls, Override(...)]``,
    ``OptionValues[Cls]``), or None for an ordinary typer parameter."""
    base, extras = hint, ()
    if typing.get_origin(hint) is Annotated:
        base, *extras = typing.get_args(hint)
    values = [extra for extra in extras if isinstance(extra, _ValuesOf)]
    overrides = [extra for extra in extras if isinstance(extra, Override)]
    if values:
        cls, as_values = values[0].config, True
    elif isinstance(base, type) and dataclasses.is_dataclass(base):
        cls, as_values = base, False
    else:
        return None
    specs = _overridden(option_specs(cls), overrides[0] if overrides else None, cls)
    if not specs:
        raise TypeError(f"{cls.__name__} declares no command-line option")
    return _Group(name, cls, as_values, specs)


def with_options(function: Callable) -> Callable:
    """The command ``function`` with each dataclass-annotated parameter expanded into that dataclass's
    options (module doc); other parameters (``typer.Argument``) stay as they are.

    typer sees the expanded signature; the function is called with each group built from the parsed
    values (an option group or config: its instance; ``OptionValues[Config]``: the values by field name).

    Raises:
        TypeError: two options with one Python name or flag, or a group without options.
    """
    hints = typing.get_type_hints(function, include_extras=True)
    parameters: list[inspect.Parameter] = []
    groups: list[_Group] = []
    plain: list[str] = []
    for parameter in inspect.signature(function).parameters.values():
        hint = hints.get(parameter.name, parameter.annotation)
        group = _group_of(parameter.name, hint)
        if group is None:
            parameters.append(parameter.replace(annotation=hint, kind=inspect.Parameter.KEYWORD_ONLY))
            plain.append(parameter.name)
        else:
            parameters += [spec.parameter() for spec in group.specs]
            groups.append(group)
    names = [parameter.name for parameter in parameters]
    flags = [flag for group in groups for spec in group.specs for flag in spec.settings.flags]
    for what, items in (("parameter", names), ("flag", flags)):
        repeated = sorted({item for item in items if items.count(item) > 1})
        if repeated:
            raise TypeError(f"{function.__qualname__}: {what} {', '.join(repeated)} declared twice")

    @functools.wraps(function)
    def command(**values: Any) -> Any:
        arguments = {name: values[name] for name in plain}
        for group in groups:
            typed = {spec.field: values[spec.name] for spec in group.specs}
            arguments[group.parameter] = typed if group.as_values else config_from_options(group.cls, typed)
        return function(**arguments)

    command.__signature__ = inspect.Signature(parameters)
    command.__annotations__ = {parameter.name: parameter.annotation for parameter in parameters}
    return command
