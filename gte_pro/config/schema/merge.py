"""The merge group (model soups: mode=merge) and the sweep group (a sweep's soup of its finished runs)."""

from dataclasses import dataclass

from gte_pro.config.rules import choice, number, text_list
from gte_pro.config.schema.types import setting

MERGE_METHODS = ("uniform", "greedy", "slerp")
SWEEP_SOUPS = ("uniform", "greedy", None)


@dataclass
class MergeSchema:
    """Model soups: ``mode=merge`` (conf/merge/default.yaml says what it writes)."""

    models: list[str] = setting([], "the members (required with mode=merge, at least two): sentence-transformers "
                                "folders of one base model's fine-tunes, e.g. [<run A>/model,<run B>/model]",
                                text_list())
    method: str = setting("uniform", "uniform: the mean of the members' weights; greedy: Wortsman's greedy soup "
                          "(members by validation NDCG@10, each kept if the soup's does not fall); slerp: spherical "
                          "interpolation of exactly two members", choice(*MERGE_METHODS))
    slerp_t: float = setting(0.5, "method=slerp: 0 gives the first member, 1 the second", number(0, 1))


@dataclass
class SweepSchema:
    """What a multirun (``python train.py -m ...``) does after its last job."""

    soup: str | None = setting(None, "merge the sweep's finished runs into <sweep dir>/soup (mode=merge with this "
                               "method; its and each run's validation go into the sweep report); null: no soup",
                               choice(*SWEEP_SOUPS))
