"""Secrets stay out of what a run writes: API keys and tokens live in the environment, never in saved configs."""

from __future__ import annotations

import os
import re
from typing import Any

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)


def redact_secrets(blob: Any) -> Any:
    """``blob`` with every value that equals a secret environment variable (``*KEY*``, ``*TOKEN*``, ...) replaced:
    a ``${oc.env:WANDB_API_KEY}`` in a config must not reach the loggers' saved hyper-parameters or the run folder."""
    secrets = {value for name, value in os.environ.items() if SECRET_NAME.search(name) and len(value) >= 8}
    return _redact(blob, secrets) if secrets else blob


def _redact(blob: Any, secrets: set[str]) -> Any:
    if isinstance(blob, dict):
        return {key: _redact(value, secrets) for key, value in blob.items()}
    if isinstance(blob, list):
        return [_redact(value, secrets) for value in blob]
    return "<redacted>" if isinstance(blob, str) and blob in secrets else blob
