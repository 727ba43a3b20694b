"""The keys of conf/train.yaml's top level and the trainer keys gte-pro checks.

Neither is a Hydra schema: the top level holds every group, and the trainer passes any other Lightning ``Trainer``
argument through. They state the meaning, default and rule of each key for ``gte_pro.config.checks`` and the docs;
tests/test_config_schema.py holds conf/train.yaml's and conf/trainer/default.yaml's values to these defaults."""

from dataclasses import dataclass
from typing import Any

from gte_pro.config.rules import DEVICES, MEMORY_BUDGET, SEED, choice, integer, number
from gte_pro.config.rules import FLAG as IS_FLAG
from gte_pro.config.schema.types import FLAG, setting
from gte_pro.launch.resume import RESUME_CHOICES

MODES = ("train", "eval", "mine", "score", "merge")
TASKS = ("embed", "rerank")


@dataclass
class RunSchema:
    """The top level of conf/train.yaml."""

    task_name: str = setting("train", "names the output folders: outputs/<task_name>/..., multirun/<task_name>/...")
    mode: str = setting("train", "train: fit, validate, export; eval: evaluate model=... on eval.beir; mine: hard "
                        "negatives for the training rows; score: teacher scores for every row; merge: a model soup "
                        "of merge.models", choice(*MODES))
    task: str = setting("embed", "embed: train an embedder; rerank: a reranker (the task/ group)", choice(*TASKS))
    seed: int = setting(42, "seeds Python, numpy and torch on every rank", SEED)
    devices: Any = setting(1, "devices (GPUs, or CPU processes) per node", DEVICES)
    nodes: int = setting(1, "machines, each running `devices` processes (the trainer's num_nodes and the SLURM "
                         "launcher's nodes follow it)", integer(1))
    ckpt_path: str | None = setting(None, "resume from this Lightning checkpoint")
    resume: str = setting("auto", "auto: a run folder holding checkpoints/last.ckpt continues from it; never: always "
                          "start fresh; force: continue although training keys changed (recorded)",
                          choice(*RESUME_CHOICES))
    lr_find: FLAG = setting(False, "run Lightning's learning-rate finder first and train with its suggestion",
                            IS_FLAG)
    lr_find_steps: int = setting(100, "steps of the learning-rate range test", integer(1))
    optimized_metric: str = setting("val/ndcg@10", "the value train() returns, which sweeps (Optuna) optimise")
    matmul_precision: str = setting("high", "torch.set_float32_matmul_precision: high lets fp32 matmuls use TF32 on "
                                    "Ampere+ GPUs", choice("highest", "high", "medium"))


@dataclass
class TrainerSchema:
    """The keys of conf/trainer/default.yaml that gte-pro checks (any other Lightning Trainer argument passes)."""

    max_epochs: int | None = setting(1, "epochs (-1 or null: no limit; max_steps decides)", integer(-1, optional=True))
    max_steps: int = setting(-1, "optimizer steps; -1: no step limit (max_epochs decides)", integer(-1))
    memory_budget: Any = setting("auto", "memory per device, checked before the model loads: auto (the GPU's "
                                 "memory; on the CPU the RAM shared by the processes), GiB, or null (never refuse); "
                                 "not a Lightning option", MEMORY_BUDGET)
    gradient_clip_val: float | None = setting(1.0, "clip the gradient norm to this (null: off)",
                                              number(0, optional=True))
    accumulate_grad_batches: int = setting(1, "batches per optimizer step", integer(1))
    log_every_n_steps: int = setting(10, "log the training metrics every N steps", integer(0))
    val_check_interval: float | None = setting(1.0, "validate every epoch; a float < 1: that fraction of an epoch; "
                                               "an int: every N steps", number(0, open_low=True, optional=True))
    check_val_every_n_epoch: int | None = setting(1, "validate every N epochs", integer(1, optional=True))
    num_sanity_val_steps: int = setting(0, "train() validates once before training instead of a sanity check",
                                        integer(-1))
    limit_train_batches: float | None = setting(None, "a fraction or a number of training batches per epoch (null: "
                                                "all)", number(0, optional=True))
