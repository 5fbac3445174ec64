"""Flag types that refuse what no user means: NaN, infinities, negative seconds or counts."""

from __future__ import annotations

import math

import click


class Finite(click.ParamType):
    """A finite number within [low, high] (open at low when `low_open`): `nan`, `inf` and `-1` are
    refused with the range, where click's FloatRange lets NaN through (every comparison with it is
    false)."""

    name = "number"

    def __init__(self, low: float = 0.0, high: float = math.inf, *, low_open: bool = False,
                 integer: bool = False) -> None:
        self.low, self.high, self.low_open, self.integer = low, high, low_open, integer

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> float | int:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        else:
            try:
                number = float(str(value).strip()) if not self.integer else int(str(value).strip())
            except ValueError:
                self.fail(f"{value!r} is not {'a whole number' if self.integer else 'a number'}", param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        below = number <= self.low if self.low_open else number < self.low
        if below or number > self.high:
            bracket = "(" if self.low_open else "["
            high = "..." if math.isinf(self.high) else _number(self.high)
            self.fail(f"{value!r} is not in the range {bracket}{_number(self.low)}, {high}]", param, ctx)
        return int(number) if self.integer else number


def _number(x: float) -> str:
    return str(int(x)) if x == int(x) else f"{x:g}"


def seconds(low: float = 0.0, high: float = 10 * 24 * 3600.0, *, low_open: bool = True) -> Finite:
    """A duration: more than 0 s (or `low`) and at most ten days unless said otherwise."""
    return Finite(low, high, low_open=low_open)


def count(low: int = 0, high: int = 1_000_000) -> Finite:
    return Finite(low, high, integer=True)


def model_option(what: str):  # noqa: ANN201 - click's decorator
    """`--model NAME`: one model of an inventory that lists several (by its name in models:)."""
    return click.option("--model", "model_name", metavar="NAME", default=None,
                        help=f"{what} of this model, where the inventory lists several (its name in models:).")
