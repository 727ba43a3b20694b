"""What every training variant of bench_train.py shares (child side): variant specs, the composed Hydra config,
the step clock (throughput, tokens, FLOP/s) and the fingerprint of the first batch."""

from __future__ import annotations

import argparse
import hashlib
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness
from harness import Result

CONF = harness.REPO / "conf"
KINDS = ("ours", "plain", "st", "seed")
CONFIG_KINDS = ("ours", "plain", "seed")  # built from the composed Hydra config; accept overrides
WARMUP_STEPS = 2


@dataclass(frozen=True)
class Variant:
    spec: str
    kind: str
    overrides: tuple[str, ...] = ()


def parse_variants(text: str) -> list[Variant]:
    """``"ours,plain,ours:model.attn_implementation=eager"`` -> variants (duplicates dropped, order kept)."""
    variants: dict[str, Variant] = {}
    for spec in (s.strip() for s in text.split(",") if s.strip()):
        kind, *overrides = spec.split(":")
        if kind not in KINDS:
            raise SystemExit(f"unknown variant {kind!r} in {spec!r}; valid: {', '.join(KINDS)}")
        if overrides and kind not in CONFIG_KINDS:
            raise SystemExit(f"{spec!r}: only {', '.join(CONFIG_KINDS)} take Hydra overrides")
        if bad := [o for o in overrides if "=" not in o]:
            raise SystemExit(f"{spec!r}: overrides must be key=value, got {bad}")
        variants.setdefault(spec, Variant(spec, kind, tuple(overrides)))
    if not variants:
        raise SystemExit("--variants is empty")
    return list(variants.values())



# --- the composed config (worker side) -----------------------------------------------------------------------------
def base_overrides(opts: argparse.Namespace) -> list[str]:
    """Hydra overrides every variant shares: the benchmark's sizes, and no logging, checkpoints or validation."""
    overrides = [
        f"seed={opts.seed}", f"data.batch_size={opts.batch_size}", f"data.max_length={opts.max_length}",
        f"trainer.max_steps={opts.steps + WARMUP_STEPS}", "trainer.max_epochs=-1", f"precision={opts.precision}",
        "logger=none", "callbacks=none", "trainer.num_sanity_val_steps=0", "++trainer.limit_val_batches=0",
        "++trainer.enable_checkpointing=false", "++trainer.enable_progress_bar=false",
        "++trainer.enable_model_summary=false",
    ]
    if opts.pairs_file:
        overrides += ["data=jsonl", f"data.train_file={Path(opts.pairs_file).resolve()}"]
    if opts.pairs:
        overrides.append(f"data.max_train_rows={opts.pairs}")
    return overrides


def compose_cfg(opts: argparse.Namespace, extra: Sequence[str] = ()) -> Any:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import open_dict

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=base_overrides(opts) + list(extra))
    with open_dict(cfg):
        cfg.paths.output_dir = opts.work_dir  # normally Hydra's run folder; nothing is written there
    return cfg


def device_of() -> Any:
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def autocast(opts: argparse.Namespace) -> Any:
    import torch

    if opts.precision == "bf16-mixed":
        return torch.autocast(device_of().type, dtype=torch.bfloat16)
    return nullcontext()


# --- measurement helpers (worker side) ----------------------------------------------------------------------------
class StepClock:
    """Per step: wall time at its end (after a device sync), real and padded tokens, loss. Warm-up steps are
    recorded but not counted."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.real: list[int] = []
        self.padded: list[int] = []
        self.losses: list[float] = []

    def tick(self, real: int, padded: int, loss: Any) -> None:
        self.times.append(harness.clock())
        self.real.append(int(real))
        self.padded.append(int(padded))
        self.losses.append(float(loss))

    def summary(self, batch_size: int, params: int) -> Result:
        if len(self.times) <= WARMUP_STEPS:
            raise RuntimeError(f"only {len(self.times)} steps ran: too little data for the requested steps?")
        seconds = self.times[-1] - self.times[WARMUP_STEPS - 1]
        steps = len(self.times) - WARMUP_STEPS
        real, padded = sum(self.real[WARMUP_STEPS:]), sum(self.padded[WARMUP_STEPS:])
        return {
            "measured_steps": steps, "seconds": seconds, "samples_per_s": steps * batch_size / seconds,
            "real_tokens_per_s": real / seconds, "padding_fraction": 1 - real / max(padded, 1),
            # forward + backward ~ 6 FLOPs per parameter per token; padded positions are computed too
            "gflops": 6 * params * padded / seconds / 1e9, "losses": self.losses,
            "step_seconds": [b - a for a, b in zip(self.times, self.times[1:], strict=False)],
        }


def token_counts(*features: dict[str, Any], chunks: int = 1) -> tuple[int, int]:
    """(real, computed) tokens of tokenized batches: a pass in length chunks computes each chunk at its own width
    (``model.length_chunks``), one pass the whole padded tensor."""
    from gte_pro.models.length_chunks import padded_positions

    lengths = [f["attention_mask"].sum(dim=1).cpu().numpy() for f in features]
    return (sum(int(n.sum()) for n in lengths),
            sum(padded_positions(n, chunks, f["input_ids"].shape[1]) for n, f in zip(lengths, features, strict=True)))


def fingerprint(*features: dict[str, Any]) -> str:
    """A hash of the input ids of a batch: equal batches, equal fingerprints."""
    digest = hashlib.sha1()
    for f in features:
        ids = f["input_ids"].detach().cpu().contiguous()
        digest.update(str(tuple(ids.shape)).encode() + ids.numpy().tobytes())
    return digest.hexdigest()[:12]


def non_embedding_params(model: Any) -> int:
    return sum(p.numel() for name, p in model.named_parameters() if "embeddings" not in name)


def trained(clock: StepClock, batch_size: int, backbone: Any, first_batch: str | None) -> Result:
    """What every variant reports: its throughput figures, its peak memory, the fingerprint of its first batch."""
    return {**clock.summary(batch_size, non_embedding_params(backbone)), **harness.peak_memory(),
            "first_batch": first_batch}

