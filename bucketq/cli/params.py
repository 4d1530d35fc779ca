"""Parameter types: durations such as ``90``, ``30s``, ``5m``, ``2h``, ``1d``, ``1h30m``; and one option per
``QueueOptions`` field, generated from the dataclass."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import re
import types
import typing
from collections.abc import Callable
from typing import Any

import click

from bucketq.options import QueueOptions

_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw]?)")


def parse_duration(text: str) -> float:
    text = text.strip().lower()
    if not text or _PART.sub("", text):
        raise ValueError(f"{text!r} is not a duration (examples: 90, 30s, 5m, 2h, 1d, 1h30m)")
    return sum(float(n) * _UNITS[unit] for n, unit in _PART.findall(text))


class Duration(click.ParamType):
    name = "DURATION"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, (int, float)):
            return float(value)
        try:
            return parse_duration(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


DURATION = Duration()


# -- queue options ---------------------------------------------------------------------------------------------

_UNSET_TO_NONE = object()  # "--inbox-retention none": the option's value None, unlike an option not given
# Entries of the cleaned docstring (inspect.cleandoc: Python 3.13 strips docstring indentation when compiling,
# older versions keep it): "    name: text", inside sections whose headers start at column 0.
_DOC_ENTRY = re.compile(r"^ {4}([a-z_]+(?:, [a-z_]+)*): (.*?)(?=^ {4}[a-z_]+(?:, [a-z_]+)*: |^\S|\Z)",
                        re.M | re.S)


class FieldValue(click.ParamType):
    """A value of a ``QueueOptions`` field typed ``int``, ``float``, ``str`` or a union of them with None
    (given as ``none``). Ranges are checked by ``QueueOptions`` itself, with its own messages."""

    def __init__(self, types: tuple[type, ...]) -> None:
        self.types = types
        self.name = "|".join(["INTEGER" if int in types else "NUMBER" if float in types else "TEXT",
                              *(["none"] if type(None) in types else [])])

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        text = value.strip()
        if type(None) in self.types and text.lower() == "none":
            return _UNSET_TO_NONE
        for kind in (int, float):
            if kind in self.types:
                with contextlib.suppress(ValueError):
                    return kind(text)
        if str in self.types:
            return text
        self.fail(f"{value!r} is not {'an integer' if int in self.types else 'a number'}"
                  f"{' or none' if type(None) in self.types else ''}", param, ctx)


def queue_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add one option per ``QueueOptions`` field, made from its type, default and docstring entry: ``--lease``,
    ``--max-attempts``, ``--dedupe/--no-dedupe``, ``--malformed [quarantine|skip]``, ... The command receives
    the options given (only those) as one ``queue_options`` dict, ready for ``Queue(**queue_options)``."""
    names = [f.name for f in dataclasses.fields(QueueOptions)]

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        given = {n: kwargs.pop(n) for n in names}
        options = {n: None if v is _UNSET_TO_NONE else v for n, v in given.items() if v is not None}
        return command(*args, queue_options=options, **kwargs)

    for option in reversed([_option(f, hint) for f, hint in _fields()]):
        wrapper = option(wrapper)
    return wrapper


def _fields() -> list[tuple[dataclasses.Field, Any]]:
    hints = typing.get_type_hints(QueueOptions)
    return [(f, hints[f.name]) for f in dataclasses.fields(QueueOptions)]


# A field whose text values are of a few kinds the type cannot tell (QueueOptions checks them).
_METAVARS = {"write_concern": "1..50|majority|TAG|none"}


def _option(f: dataclasses.Field, hint: Any) -> Callable[[Any], Any]:
    flag = "--" + f.name.replace("_", "-")
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    help_text = f"{field_help().get(f.name, '')} [default: {default_label(flag, f.default, bool in args)}]".strip()
    if bool in args:
        return click.option(f"{flag}/--no-{flag[2:]}", f.name, default=None, help=help_text)
    if typing.get_origin(hint) is typing.Literal:
        return click.option(flag, f.name, type=click.Choice(typing.get_args(hint)), help=help_text)
    return click.option(flag, f.name, type=FieldValue(args), metavar=_METAVARS.get(f.name), help=help_text)


def default_label(flag: str, default: Any, is_flag: bool) -> str:
    """A field's default as it is given on the command line: the flag (``--no-dedupe``), ``none``, or the value.
    A flag whose default is None is neither given: the field's text says what None does."""
    if is_flag:
        return "neither flag (None)" if default is None else flag if default else f"--no-{flag[2:]}"
    return "none" if default is None else str(default)


@functools.cache
def field_help() -> dict[str, str]:
    """Each ``QueueOptions`` field's entry in its docstring, on one line without reST markup."""
    doc = inspect.cleandoc(QueueOptions.__doc__ or "")
    return {name: " ".join(text.replace("``", "").split())
            for names, text in _DOC_ENTRY.findall(doc) for name in names.split(", ")}
