"""What the schemas share: ``setting``, a dataclass field that also holds the key's meaning and its rule, and FLAG,
the type of a boolean that the rules check (see the package docstring)."""

import copy
from dataclasses import field, is_dataclass
from typing import Any

from gte_pro.config.rules import Rule

FLAG = Any


def setting(default: Any, doc: str, rule: Rule | None = None, argument: bool = True) -> Any:
    """A schema field: its ``default``, a one-line ``doc`` (docs/configuration.md's tables are made from it) and the
    ``rule`` that ``gte_pro.config.checks`` applies to its value (None: its type says all). ``argument=False``: a
    key the group's ``_target_`` does not take (``model.lr`` goes to the optimizer)."""
    metadata = {"doc": doc, "rule": rule, "argument": argument}
    if isinstance(default, list | dict) or is_dataclass(default):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def redefault(owner: type, name: str, default: Any) -> Any:
    """``owner``'s setting ``name`` (its meaning and rule) with another default, for a subclass whose option differs."""
    metadata = owner.__dataclass_fields__[name].metadata
    return setting(default, metadata["doc"], metadata["rule"], metadata["argument"])
