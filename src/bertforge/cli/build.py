"""Turning plain functions (and the run-config dataclasses) into typer commands.

A command is a function with type hints and a Google-style docstring. `command()` reads both:
parameters without a default become positional arguments, the others `--dash-case` options;
the docstring's summary is the command's help and its `Args:` entries are the flags' help.
A `**settings` parameter stands for every field of a run-config dataclass (`PretrainConfig`,
`FinetuneConfig`), whose help comes from the field itself, plus `--config FILE` to read them from
JSON or YAML. So each default `--help` shows is the one the function or dataclass uses.
"""

from __future__ import annotations

import inspect
import math
import types
import typing
from dataclasses import MISSING
from typing import Annotated, Any, Callable, Literal

import docstring_parser
import typer

from ..errors import BertforgeError


def finite_float(value: Any) -> float:
    """A float flag that refuses nan and inf: no setting of bertforge means anything with them."""
    if isinstance(value, float) and math.isfinite(value):
        return value
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise typer.BadParameter(f"{value!r} is not a number") from None
    if not math.isfinite(number):
        raise typer.BadParameter(f"{value!r} is not a finite number")
    return number


def duration(value: Any) -> float:
    """Seconds, or a time such as 90s, 30m, 1.5h."""
    if isinstance(value, float):
        return value
    from ..settings import parse_duration

    try:
        return parse_duration(value)
    except BertforgeError as exc:
        raise typer.BadParameter(str(exc)) from None


def choice(options: tuple[str, ...]) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        if value not in options:
            raise typer.BadParameter(f"{value!r} is not one of {', '.join(options)}")
        return value

    return parse


DURATION_FIELDS = {"time_budget"}


def _bare(annotation: Any) -> tuple[Any, bool]:
    """(type, optional) for `X`, `X | None` or `Optional[X]`."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0], True
    return annotation, False


def _parameter(name: str, annotation: Any, default: Any, help_text: str, positional: bool,
               keyword_only: bool = False) -> inspect.Parameter:
    """One typer parameter for a function argument or a dataclass field."""
    bare, optional = _bare(annotation)
    kwargs: dict[str, Any] = {"help": help_text}
    if typing.get_origin(bare) is Literal:
        options = tuple(str(v) for v in typing.get_args(bare))
        kwargs.update(parser=choice(options), metavar=name.upper() if positional else "[" + "|".join(options) + "]")
        if positional:
            kwargs["help"] = f"{help_text}: {', '.join(options)}"
        annotation = str | None if optional else str
    elif name in DURATION_FIELDS:
        kwargs.update(parser=duration, metavar="DURATION")
    elif bare is float:
        kwargs.update(parser=finite_float, metavar="FLOAT")
    decls: tuple[str, ...] = ()
    if bare is bool and not positional:
        kwargs["show_default"] = False
        if default is False:  # a plain switch, as argparse's store_true; True/None defaults get --no-NAME too
            decls = ("--" + name.replace("_", "-"),)
    elif "metavar" not in kwargs:
        item = typing.get_args(bare)[0] if typing.get_origin(bare) is list else bare
        kwargs["metavar"] = name.upper() if positional else {int: "INT", str: "TEXT"}.get(item, "VALUE")
    info = typer.Argument(**kwargs) if positional else typer.Option(*decls, **kwargs)
    kind = inspect.Parameter.KEYWORD_ONLY if keyword_only else inspect.Parameter.POSITIONAL_OR_KEYWORD
    default = inspect.Parameter.empty if default is MISSING else default
    if positional and typing.get_origin(bare) is list and default is inspect.Parameter.empty:
        default = None  # a list of positionals may be empty; the command decides whether that is allowed
    return inspect.Parameter(name, kind, default=default, annotation=Annotated[annotation, info])


def settings_parameters(cls: type, skip: frozenset[str] = frozenset()) -> list[inspect.Parameter]:
    """Options for the user-facing fields of a run-config dataclass, with the field's own help."""
    from ..settings import cli_fields

    hints = typing.get_type_hints(cls)
    params = []
    # Grouped by the group that introduces each field (not a command that only changes its default or help): the
    # command's own settings first, then its groups', then the loop's, evaluation and output.
    owners = {f.name: [k for k in cls.__mro__ if f.name in k.__dict__.get("__annotations__", {})][-1]
              for f in cli_fields(cls)}
    for f in sorted(cli_fields(cls), key=lambda f: cls.__mro__.index(owners[f.name])):
        if f.name in skip:
            continue
        default = f.default if f.default is not MISSING else f.default_factory()
        if isinstance(default, list) and not default:
            default = None
        params.append(_parameter(f.name, hints[f.name], default, f.metadata.get("help", ""), positional=False,
                                 keyword_only=True))
    return params


def given_on_command_line(ctx: typer.Context, names: list[str]) -> set[str]:
    """Which of these parameters the user typed (as opposed to their defaults)."""
    return {n for n in names if getattr(ctx.get_parameter_source(n), "name", "") == "COMMANDLINE"}


def settings_from(cls: type, values: dict[str, Any], config: str | None, ctx: typer.Context | None = None,
                  **fixed: Any):
    """A run config from the command line, over a config file, over the dataclass's defaults.

    Flags the user typed win over the file; the file wins over defaults; `fixed` (positional
    arguments such as the task) wins over both.
    """
    from ..settings import read_config_file

    typed = given_on_command_line(ctx, list(values)) if config and ctx is not None else set(values)
    chosen = {k: v for k, v in values.items() if k in typed and v is not None}  # None: the field's own default
    if config:
        chosen = {**read_config_file(config, cls), **chosen}
    return cls(**chosen, **fixed)


def command(app: typer.Typer, name: str, settings: type | None = None,
            settings_skip: frozenset[str] = frozenset()) -> Callable[[Callable], Callable]:
    """Register `func` as subcommand `name`; its signature and docstring become flags and help."""

    def register(func: Callable) -> Callable:
        doc = docstring_parser.parse(inspect.getdoc(func) or "")
        helps = {p.arg_name: p.description or "" for p in doc.params}
        hints = typing.get_type_hints(func)
        params = []
        for p in inspect.signature(func).parameters.values():
            if p.kind is inspect.Parameter.VAR_KEYWORD or p.name == "ctx":  # ctx: handed over by `run` below
                continue
            # Parameters before `*` are positional arguments (lists of them may be empty); after it, options.
            positional = p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and (
                p.default is inspect.Parameter.empty or typing.get_origin(_bare(hints[p.name])[0]) is list)
            default = MISSING if p.default is inspect.Parameter.empty else p.default
            params.append(_parameter(p.name, hints[p.name], default, helps.get(p.name, ""), positional,
                                     keyword_only=p.kind is inspect.Parameter.KEYWORD_ONLY))
        if settings is not None:
            params += settings_parameters(settings, settings_skip)
        params.append(inspect.Parameter(
            "verbose", inspect.Parameter.KEYWORD_ONLY, default=False,
            annotation=Annotated[bool, typer.Option("-v", "--verbose", help="log loading details")]))

        params.append(inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context))

        def run(**kwargs: Any) -> Any:
            from . import set_verbosity

            set_verbosity(kwargs.pop("verbose"))
            ctx = kwargs.pop("ctx")
            if settings is not None:  # which settings were typed, to rank them above a --config file
                kwargs["ctx"] = ctx
            return func(**kwargs)

        run.__signature__ = inspect.Signature(sorted(params, key=lambda q: q.kind))  # positional first
        run.__name__, run.__doc__ = func.__name__, func.__doc__
        run.__annotations__ = {q.name: q.annotation for q in params}
        summary = "\n\n".join(t for t in (doc.short_description, doc.long_description) if t)
        app.command(name, help=summary, short_help=doc.short_description)(run)
        return func

    return register
