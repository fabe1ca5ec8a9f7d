"""Every subcommand's options, declared once: as the fields of its config (:mod:`srollout.config`).
The flag is the field name with ``-`` for ``_`` (``T_max`` -> ``--T-max``), the help the field's
(``help_for``), the default the field's; a tuple field is a comma list. :func:`config_options` adds
them to a Typer command in its ``--help`` order and hands them over as one dict::

    @app.command("collect")
    @config_options(CollectConfig, COLLECT_OPTIONS, order=(*COLLECT_OPTIONS, "workers"))
    def collect(options: dict[str, Any], workers: int = 1) -> None:
        config = CollectConfig(**config_values(CollectConfig, options))

Options from several configs: one decorator per config, each handing its options on under its own
name (``into``), as ``sweep`` does.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import itertools
import sys
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from srollout.config import (
    QUICK_GROUPS,
    QUICK_T_MAX,
    help_for,
    parse_grid,
    parse_int_list,
    parse_names,
    parse_seeds,
)

# The rollout options of RolloutOptions, in the order `collect --help` lists them.
ROLLOUT_OPTIONS: tuple[str, ...] = (
    *("groups", "G", "T_max", "temperature", "top_p", "seed"),
    *("model", "adapter", "backend", "base_url", "tasks", "difficulty", "policy", "eps"),
    *("gate", "K", "d_L", "rule", "t_high", "signal_K", "concurrency", "env"),
    *("audit", "audit_floor", "stall", "stall_from", "loop"),
)
# Where a run is written, and --quick (which sizes groups and T_max).
RUN_OPTIONS: tuple[str, ...] = ("out", "overwrite", "resume", "quick")
# Options whose default depends on --quick: declared without one, the default named in the help.
QUICK_SIZED = {"groups": QUICK_GROUPS, "T_max": QUICK_T_MAX}
# Other names an option answers to (a short form).
ALIASES: dict[str, tuple[str, ...]] = {"arms": ("--arm",)}
# Options renamed: field -> the field it was (its old flag still works, hidden, and says so).
RENAMED: dict[str, str] = {"audit_floor": "precision_floor"}


def flag(name: str) -> str:
    """The option of field ``name``: ``T_max`` -> ``--T-max``, ``d_L`` -> ``--d-L``."""
    return "--" + name.replace("_", "-")


def list_parser(config_cls: type, name: str) -> Callable[[str], tuple] | None:
    """How a field of tuple type is read from its comma list (a string on the command line):
    integers, a float grid (``start:stop:step`` or a comma list), or names; None for a field of
    another type."""
    hint = typing.get_type_hints(config_cls)[name]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if typing.get_origin(hint) is not tuple:
        return None
    if name == "seeds":
        return parse_seeds
    if typing.get_args(hint)[0] is int:
        return lambda text: parse_int_list(text, flag(name))
    if typing.get_args(hint)[0] is float:
        return lambda text: parse_grid(text, flag(name))
    return lambda text: parse_names(text, flag(name))


def list_text(values: Sequence) -> str:
    """A tuple default as the command line spells it: an evenly spaced float grid of three or
    more points as ``start:stop:step``, anything else as a comma list."""
    if len(values) >= 3 and all(type(v) is float for v in values):
        step = round(values[1] - values[0], 10)
        if step > 0 and all(round(b - a, 10) == step for a, b in itertools.pairwise(values)):
            return f"{values[0]:g}:{values[-1]:g}:{step:g}"
    return ",".join(map(str, values))


def option_parameter(
    config_cls: type,
    name: str,
    *,
    help: Callable[[str], str] | None = None,
    from_preset: bool = False,
) -> inspect.Parameter:
    """The Typer parameter of ``config_cls``'s field ``name`` (``help``, ``from_preset``: see
    :func:`config_options`). --help shows the field's default, except a default of None and
    --quick's groups / T_max (named in the help); a bool on by default is ``--x/--no-x``."""
    field = config_cls.__dataclass_fields__[name]
    hint = typing.get_type_hints(config_cls)[name]
    text = help(name) if help is not None else help_for(config_cls, name)
    default = field.default
    show_default: bool | None = None
    if list_parser(config_cls, name) is not None:
        hint = str if default is not None else str | None
        default = list_text(default) if default is not None else None
        show_default = None if default is not None else False
    if from_preset:
        hint, default, show_default = hint | None, None, False
    elif name in QUICK_SIZED and "quick" in config_cls.__dataclass_fields__:
        text += f"  \\[default: {default}]"
        hint, default, show_default = hint | None, None, False
    elif default is None and hint in (Path | None, int | None, float | None):
        show_default = False
    names = (flag(name), *ALIASES.get(name, ()))
    if hint is bool and default is True:  # a switch on by default: --x/--no-x
        names = (f"{flag(name)}/--no-{flag(name)[2:]}",)
    kwargs: dict[str, Any] = (
        {"help": text} if show_default is None else {"help": text, "show_default": False}
    )
    return inspect.Parameter(
        name,
        inspect.Parameter.KEYWORD_ONLY,
        default=default,
        annotation=Annotated[hint, typer.Option(*names, **kwargs)],
    )


def config_options(
    config_cls: type,
    names: Sequence[str],
    *,
    order: Sequence[str] | None = None,
    help: Callable[[str], str] | None = None,
    from_preset: Sequence[str] = (),
    into: str = "options",
    argument: str | None = None,
) -> Callable:
    """Decorator of a Typer command: declare the options ``names`` of ``config_cls`` (see
    :func:`option_parameter`) beside the command's own parameters, listed in ``order`` (every
    name, the command's own parameters included; default: ``argument``, ``names``, then the
    command's own), and call the command with their values as ``into`` (default ``options``:
    field name -> the value given; see :func:`config_values`).

    help: the help text of a field (default ``help_for``); from_preset: names whose value comes
    from a preset when not given (default None, no default shown); argument: a path field given
    as the command's positional argument (``INPUT``), handed on with the options."""

    def decorate(command: Callable) -> Callable:
        own = {
            p.name: p
            for p in inspect.signature(command, eval_str=True).parameters.values()
            if p.name != into and p.annotation != dict[str, Any]  # what a stacked one hands on
        }
        added = {
            n: option_parameter(config_cls, n, help=help, from_preset=n in from_preset)
            for n in names
        }
        if argument is not None:
            text = help(argument) if help else help_for(config_cls, argument)
            shown = typer.Argument(help=text, show_default=False)
            added[argument] = inspect.Parameter(
                argument, inspect.Parameter.KEYWORD_ONLY, annotation=Annotated[Path, shown]
            )
        params = {**own, **added}
        ordered_names = order or ([argument] if argument else []) + [*names, *own]
        missing = set(params) - set(ordered_names)
        if missing or len(ordered_names) != len(params):
            raise TypeError(f"rollout_options: order must list each of {sorted(params)} once")
        renamed = {new: old for new, old in RENAMED.items() if new in names}

        @functools.wraps(command)
        def run(**values: Any) -> Any:
            for new, old in renamed.items():
                if (given := values.pop(old)) is not None:
                    print(f"note: {flag(old)} is now {flag(new)}; the old name still works",
                          file=sys.stderr)  # fmt: skip
                    values[new] = given
            options = {n: values.pop(n) for n in names}
            if argument is not None:
                options[argument] = values.pop(argument)
            return command(**{into: options}, **values)

        ordered = [params[n].replace(kind=inspect.Parameter.KEYWORD_ONLY) for n in ordered_names]
        ordered += [
            inspect.Parameter(
                old,
                inspect.Parameter.KEYWORD_ONLY,
                default=None,
                annotation=Annotated[float | None, typer.Option(flag(old), hidden=True)],
            )
            for old in renamed.values()
        ]
        run.__signature__ = inspect.Signature(ordered)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in ordered}
        del run.__wrapped__  # Typer reads the signature above, not the command's own
        return run

    return decorate


def parse_lists(config_cls: type, options: dict[str, Any]) -> dict[str, Any]:
    """The options with each comma list given parsed (:func:`list_parser`; None stays None)."""
    parsers = {n: list_parser(config_cls, n) for n in options}
    return {
        n: parsers[n](v) if parsers[n] is not None and isinstance(v, str) else v
        for n, v in options.items()
    }


def config_values(config_cls: type, options: dict[str, Any]) -> dict[str, Any]:
    """The config's keyword arguments from the options: comma lists parsed, groups and T_max not
    given take ``--quick``'s sizes (with --quick) or the config's defaults."""
    values = parse_lists(config_cls, options)
    quick = bool(values.get("quick", False))
    for name, quick_value in QUICK_SIZED.items():
        if name in values and values[name] is None:
            values[name] = quick_value if quick else config_cls.__dataclass_fields__[name].default
    return values


def input_command(app: typer.Typer, name: str, config_cls: type, help: str, stage: str) -> None:
    """Add ``srollout NAME INPUT``: every field of ``config_cls`` an option but ``input`` (the
    argument); runs ``stage`` (``module:function``, imported only then) on the config."""
    names = tuple(f.name for f in dataclasses.fields(config_cls) if f.name != "input")

    @app.command(name, help=help, short_help=help.split("\n")[0])
    @config_options(config_cls, names, argument="input")
    def command(options: dict[str, Any]) -> None:
        module, function = stage.split(":")
        run = getattr(importlib.import_module(module), function)
        run(config_cls(**parse_lists(config_cls, options)))
