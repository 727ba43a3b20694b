"""The vocabulary of ``gte_pro.config.checks``' rules: each takes a config value and returns what is wrong with it
(a short phrase naming what is valid), or None when it is fine."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from gte_pro.launch.environment import device_count


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def integer(low: int | None = None, optional: bool = False) -> Callable[[Any], str | None]:
    """An int (not a bool) of at least ``low``; ``optional``: or null."""
    def check(value: Any) -> str | None:
        if value is None and optional:
            return None
        if isinstance(value, int) and not isinstance(value, bool) and (low is None or value >= low):
            return None
        return "expected an integer" + (f" >= {low}" if low is not None else "") + (" or null" if optional else "")
    return check


def at_least(low: int) -> Callable[[Any], str | None]:
    """The range of a key whose type a schema already holds (gte_pro/config/schema/): null passes where the
    schema allows it, since Hydra refused it where it does not."""
    def check(value: Any) -> str | None:
        return None if value is None or value >= low else f"expected >= {low}"
    return check


def number(low: float | None = None, high: float | None = None, open_low: bool = False, open_high: bool = False,
           optional: bool = False) -> Callable[[Any], str | None]:
    """A finite int or float between ``low`` and ``high`` (``open_*``: the bound itself excluded)."""
    def check(value: Any) -> str | None:
        if value is None and optional:
            return None
        if is_number(value) and (low is None or value > low or (value == low and not open_low)) and (
                high is None or value < high or (value == high and not open_high)):
            return None
        bounds = [f"{'>' if open_low else '>='} {low}"] if low is not None else []
        bounds += [f"{'<' if open_high else '<='} {high}"] if high is not None else []
        return " ".join(part for part in ("expected a number", " and ".join(bounds), "or null" * optional) if part)
    return check


def choice(*options: Any) -> Callable[[Any], str | None]:
    """One of ``options``, of the same type too (``1`` is not ``true``, the string ``"false"`` is not ``false``)."""
    shown = ", ".join("null" if o is None else str(o).lower() if isinstance(o, bool) else str(o) for o in options)

    def check(value: Any) -> str | None:
        return None if any(value == o and type(value) is type(o) for o in options) else f"valid choices: {shown}"
    return check


def subset(*options: str) -> Callable[[Any], str | None]:
    """A list of distinct ``options`` (possibly empty)."""
    def check(value: Any) -> str | None:
        if isinstance(value, list) and all(v in options for v in value) and len(set(value)) == len(value):
            return None
        return f"expected a list of distinct values of: {', '.join(options)}"
    return check


def int_list(value: Any, low: int) -> str | None:
    """null, or a non-empty list of distinct integers >= low."""
    if value is None or (isinstance(value, list) and value and len(set(value)) == len(value) and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= low for v in value)):
        return None
    return f"expected null or a list of distinct integers >= {low}"


def number_list(value: Any) -> str | None:
    """null, or a list of finite numbers >= 0."""
    if value is None or (isinstance(value, list) and all(is_number(v) and v >= 0 for v in value)):
        return None
    return "expected null or a list of numbers >= 0"


def known_keys(value: Any, keys: dict[str, Any], example: str) -> str | None:
    """null, or a dict of some of ``keys`` (the encoder checks the values)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        return f"expected null or a dict such as {example}"
    unknown = sorted(set(value) - set(keys))
    return f"unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(keys)}" if unknown else None


def devices_value(value: Any) -> str | None:
    try:
        device_count(value)
    except ValueError:
        return "valid choices: a positive integer, auto, -1 (all), or device indices such as [0,1]"
    return None


FLAG = choice(True, False)
