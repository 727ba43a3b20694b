"""The vocabulary of the schemas' rules (gte_pro/config/schema/): each ``Rule`` takes a config value and returns what
is wrong with it (a short phrase naming what is valid), or None when it is fine; its ``text`` says what is valid in
the generated option tables of docs/configuration.md."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gte_pro.launch.environment import device_count


@dataclass(frozen=True)
class Rule:
    """A check of one key's value and, for the docs, what it accepts."""

    check: Callable[[Any], str | None]
    text: str

    def __call__(self, value: Any) -> str | None:
        return self.check(value)


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def integer(low: int | None = None, optional: bool = False) -> Rule:
    """An int (not a bool) of at least ``low``; ``optional``: or null."""
    text = "integer" + (f" >= {low}" if low is not None else "") + (" or null" if optional else "")

    def check(value: Any) -> str | None:
        if value is None and optional:
            return None
        return None if _is_int(value) and (low is None or value >= low) else f"expected an {text}"
    return Rule(check, text)


def number(low: float | None = None, high: float | None = None, open_low: bool = False, open_high: bool = False,
           optional: bool = False) -> Rule:
    """A finite int or float between ``low`` and ``high`` (``open_*``: the bound itself excluded)."""
    bounds = [f"{'>' if open_low else '>='} {low}"] if low is not None else []
    bounds += [f"{'<' if open_high else '<='} {high}"] if high is not None else []
    text = " ".join(part for part in ("number", " and ".join(bounds), "or null" * optional) if part)

    def check(value: Any) -> str | None:
        if value is None and optional:
            return None
        if is_number(value) and (low is None or value > low or (value == low and not open_low)) and (
                high is None or value < high or (value == high and not open_high)):
            return None
        return f"expected a {text}"
    return Rule(check, text)


def _shown(option: Any) -> str:
    return "null" if option is None else str(option).lower() if isinstance(option, bool) else str(option)


def choice(*options: Any) -> Rule:
    """One of ``options``, of the same type too (``1`` is not ``true``, the string ``"false"`` is not ``false``)."""
    shown = ", ".join(_shown(o) for o in options)

    def check(value: Any) -> str | None:
        return None if any(value == o and type(value) is type(o) for o in options) else f"valid choices: {shown}"
    return Rule(check, shown)


def subset(*options: str) -> Rule:
    """A list of distinct ``options`` (possibly empty)."""
    text = f"a list of distinct values of: {', '.join(options)}"

    def check(value: Any) -> str | None:
        if isinstance(value, list) and all(v in options for v in value) and len(set(value)) == len(value):
            return None
        return f"expected {text}"
    return Rule(check, text)


def int_list(low: int) -> Rule:
    """null, or a non-empty list of distinct integers >= low."""
    text = f"null or a list of distinct integers >= {low}"

    def check(value: Any) -> str | None:
        if value is None or (isinstance(value, list) and value and len(set(value)) == len(value) and all(
                _is_int(v) and v >= low for v in value)):
            return None
        return f"expected {text}"
    return Rule(check, text)


def number_list() -> Rule:
    """null, or a list of finite numbers >= 0."""
    def check(value: Any) -> str | None:
        if value is None or (isinstance(value, list) and all(is_number(v) and v >= 0 for v in value)):
            return None
        return "expected null or a list of numbers >= 0"
    return Rule(check, "null or a list of numbers >= 0")


def known_keys(keys: tuple[str, ...] | dict[str, Any], example: str) -> Rule:
    """null, or a dict of some of ``keys`` (the code that takes the dict checks the values)."""
    def check(value: Any) -> str | None:
        if value is None:
            return None
        if not isinstance(value, dict):
            return f"expected null or a dict such as {example}"
        unknown = sorted(set(value) - set(keys))
        return f"unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(keys)}" if unknown else None
    return Rule(check, f"null or a dict of {', '.join(keys)}, e.g. `{example}`")


def text(optional: bool = False) -> Rule:
    """A non-empty string (a path or a hub name); ``optional``: or null."""
    def check(value: Any) -> str | None:
        if (value is None and optional) or (isinstance(value, str) and value.strip()):
            return None
        return "expected a non-empty string" + (" or null" if optional else "")
    return Rule(check, "non-empty string" + (" or null" if optional else ""))


def text_list() -> Rule:
    """A list of non-empty strings (paths), possibly empty."""
    def check(value: Any) -> str | None:
        if isinstance(value, list | tuple) and all(isinstance(v, str) and v.strip() for v in value):
            return None
        return "expected a list of folders, e.g. [<run A>/model,<run B>/model]"
    return Rule(check, "a list of folders")


def teachers() -> Rule:
    """A teacher (a non-empty string), a list of them (an ensemble), or null."""
    def check(value: Any) -> str | None:
        if value is None or (isinstance(value, str) and value.strip()):
            return None
        if isinstance(value, list | tuple) and value and all(isinstance(v, str) and v.strip() for v in value):
            return None
        return "expected a folder or hub name, a non-empty list of them (an ensemble), or null"
    return Rule(check, "a folder or hub name, a list of them (an ensemble), or null")


def _devices(value: Any) -> str | None:
    try:
        device_count(value)
    except ValueError:
        return "valid choices: a positive integer, auto, -1 (all), or device indices such as [0,1]"
    return None


DEVICES = Rule(_devices, "a positive integer, auto, -1 (all), or device indices such as [0,1]")
FLAG = choice(True, False)
# numpy's range: Lightning replaces any other seed by 0, with only a warning
SEED = Rule(lambda v: integer(0)(v) or (None if v <= 2**32 - 1 else "expected an integer <= 4294967295"),
            "integer in 0 .. 4294967295")
LENGTH_CHUNKS = Rule(lambda v: None if v == "auto" or not integer(1)(v) else "expected auto or an integer >= 1",
                     "auto or integer >= 1")
MEMORY_BUDGET = Rule(lambda v: None if v in (None, "auto") else number(0, open_low=True)(v)
                     and "expected auto, a number of GiB > 0, or null", "auto, a number of GiB > 0, or null")
MINI_BATCH_SIZE = Rule(lambda v: None if v in (None, "auto") or not integer(1)(v)
                       else "expected an integer >= 1, auto, or null", "integer >= 1, auto, or null")
TEACHER_TEMPERATURE = Rule(lambda v: None if v == "auto" else number(0, open_low=True)(v)
                           and "expected auto or a number > 0", "auto or number > 0")
