"""Test-only callbacks that record what a real run did, for tests that start train.py in other processes."""

from __future__ import annotations

import socket
from pathlib import Path

import torch
from lightning.pytorch import Callback, LightningModule, Trainer


class FirstStepProbe(Callback):
    """Writes ``<out_dir>/rank<R>.pt`` on every rank: the first training step's loss on that rank, every parameter
    gradient after that step's backward (under DDP: already averaged over the ranks), and where the rank ran
    (hostname, node rank, world size)."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)
        self.loss: torch.Tensor | None = None
        self.saved = False

    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: torch.Tensor) -> None:
        if trainer.global_step == 0 and self.loss is None:
            self.loss = loss.detach().clone()

    def on_after_backward(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.global_step != 0 or self.saved:
            return
        grads = {name: p.grad.detach().clone() for name, p in pl_module.named_parameters() if p.grad is not None}
        self.out_dir.mkdir(parents=True, exist_ok=True)
        torch.save({"loss": self.loss, "grads": grads, "hostname": socket.gethostname(),
                    "node_rank": trainer.node_rank, "global_rank": trainer.global_rank,
                    "world_size": trainer.world_size}, self.out_dir / f"rank{trainer.global_rank}.pt")
        self.saved = True
