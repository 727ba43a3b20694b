"""Entry point: ``python train.py [group=option ...] [key=value ...]`` (add ``-m`` for a sweep)."""

import hydra
from omegaconf import DictConfig

from gte_pro.errors import exit_on_user_error, run_cli
from gte_pro.train import train


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    with exit_on_user_error():
        return train(cfg)


if __name__ == "__main__":
    run_cli(main)  # a user's mistake: two lines and exit code 2; a bug: its traceback
