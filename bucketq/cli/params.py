"""Parameter types: durations such as ``90``, ``30s``, ``5m``, ``2h``, ``1d``, ``1h30m``."""

from __future__ import annotations

import re
from typing import Any

import click

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
