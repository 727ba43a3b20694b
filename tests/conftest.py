"""Shared fixtures: offline settings, Hydra compose, a tokenizer, small data files."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

# never reach for a hub: everything the tests need is on the machine
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from hydra import compose, initialize_config_dir  # noqa: E402
from hydra.core.global_hydra import GlobalHydra  # noqa: E402
from omegaconf import DictConfig, open_dict  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One demo-corpus cache for the whole session (building it parses the stdlib: ~6 s)."""
    return Path(os.environ.get("GTE_PRO_TEST_CACHE") or tmp_path_factory.mktemp("cache"))


@pytest.fixture(autouse=True, scope="session")
def _cache_env(cache_dir: Path):
    """Data modules built directly (not through conf/paths) keep their token caches in the session's folder."""
    os.environ["GTE_PRO_CACHE"] = str(cache_dir)
    yield


@pytest.fixture
def make_cfg(tmp_path: Path, cache_dir: Path) -> Callable[..., DictConfig]:
    """Compose conf/train.yaml with overrides, as `python train.py <overrides>` would, writing under tmp_path."""

    def _make(overrides: list[str] | None = None, output_dir: Path | None = None) -> DictConfig:
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose("train", overrides=list(overrides or []), return_hydra_config=False)
        with open_dict(cfg):
            cfg.paths.output_dir = str(output_dir or tmp_path / "run")
            cfg.paths.cache_dir = str(cache_dir)
        return cfg

    yield _make
    GlobalHydra.instance().clear()


@pytest.fixture(scope="session")
def tokenizer():
    from transformers import AutoTokenizer

    from gte_pro import packaged_minilm_path

    return AutoTokenizer.from_pretrained(packaged_minilm_path())


def free_port() -> int:
    """A free TCP port on loopback for a test's own process group."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.fixture
def pairs_file(tmp_path: Path) -> Path:
    """60 distinct (query, positive, 2 negatives) rows about made-up topics."""
    rows = []
    for i in range(60):
        rows.append({
            "query": f"what is topic number {i}?",
            "positive": f"Topic {i} is a subject that covers item {i} in depth, with examples.",
            "negatives": [f"Unrelated passage {i}-{j} about the weather in city {j}." for j in range(2)],
        })
    return write_jsonl(tmp_path / "pairs.jsonl", rows)
