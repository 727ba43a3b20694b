"""Shared by the schemas: a boolean that gte_pro.config.checks checks (see the package docstring)."""

from typing import Any

FLAG = Any
