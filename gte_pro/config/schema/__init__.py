"""The types and defaults of the config groups whose keys are ours: data, model, loss, eval, mine, score, merge,
sweep, export.

Each schema is the one place that states a key's type, default, meaning and rule (``setting`` in ``types``: the
dataclass field's metadata holds the one-line meaning and the ``gte_pro.config.rules.Rule``). Each dataclass is a
schema in Hydra's ConfigStore (``schema/<group>/<option>``) that the option's YAML file extends
(``defaults: [/schema/data/jsonl@_here_, _self_]``), so Hydra itself refuses ``data.batch_size=abc`` or
``loss.temperature=[1]`` while it composes, naming the key, and an option's YAML holds only what it changes.
``gte_pro.config.checks`` applies each field's rule (ranges such as ``batch_size >= 2``, choices with their valid
values listed) and the rules across keys; docs/configuration.md's option tables are generated from the same fields
(``gte_pro.config.tables``). The top level and the trainer are no Hydra schemas (``run``: ``RunSchema``,
``TrainerSchema``), but state their keys the same way.

Typed ``Any`` on purpose:
- booleans: OmegaConf reads ``yes``, ``on`` and ``1`` as true, and a string must never switch
  ``model.trust_remote_code`` on; the checks accept only a real true/false;
- keys that take more than one type (``model.length_chunks``: auto or an integer; ``eval.beir``: folders or
  ``{path, split, name}``; ``data.sources``) and the trainer group, which passes any Lightning argument through;
- the dicts that default to null (``model.lora``, ``model.projection``, ``model.random_init_config``): OmegaConf 2.3
  cannot merge ``model.lora='{r: 16}'`` into a typed dict node that holds null (an AttributeError); their keys are
  checked against what the code takes.
"""

from hydra.core.config_store import ConfigStore

from gte_pro.config.schema.data import BeirData, DemoData, HfData, JsonlData, MixData
from gte_pro.config.schema.evaluation import EvalSchema
from gte_pro.config.schema.export import ExportSchema
from gte_pro.config.schema.loss import (
    DistillKLSchema,
    GTESchema,
    InfoNCESchema,
    ListwiseSchema,
    MarginMSESchema,
    PointwiseBCESchema,
)
from gte_pro.config.schema.merge import MergeSchema, SweepSchema
from gte_pro.config.schema.mining import MineSchema
from gte_pro.config.schema.model import CrossEncoderSchema, EncoderSchema
from gte_pro.config.schema.run import RunSchema, TrainerSchema
from gte_pro.config.schema.score import ScoreSchema
from gte_pro.launch.renamed import RENAMED_TARGETS as OLD_DATA_TARGETS
from gte_pro.models import OLD_TARGETS

SCHEMAS: dict[str, dict[str, type]] = {
    "data": {"demo": DemoData, "jsonl": JsonlData, "hf": HfData, "beir": BeirData, "mix": MixData},
    "model": {"encoder": EncoderSchema, "cross_encoder": CrossEncoderSchema},
    "loss": {"infonce": InfoNCESchema, "gte": GTESchema, "distill_kl": DistillKLSchema,
             "margin_mse": MarginMSESchema, "listwise": ListwiseSchema, "pointwise_bce": PointwiseBCESchema},
    "eval": {"default": EvalSchema},
    "mine": {"default": MineSchema},
    "score": {"default": ScoreSchema},
    "merge": {"default": MergeSchema},
    "sweep": {"default": SweepSchema},
    "export": {"default": ExportSchema},
}


# the groups with one schema whatever the option (no _target_ picks it); "" is the top level
FIXED_SCHEMAS: dict[str, type] = {"": RunSchema, "trainer": TrainerSchema, "eval": EvalSchema, "mine": MineSchema,
                                  "score": ScoreSchema, "merge": MergeSchema, "sweep": SweepSchema,
                                  "export": ExportSchema}


def schema_for(group: str, target: object) -> type | None:
    """The schema of ``group`` whose ``_target_`` is ``target`` (the fixed one for eval, mine, score, merge, sweep,
    export, trainer and the top level); None for a class of the user's own."""
    if group in FIXED_SCHEMAS:
        return FIXED_SCHEMAS[group]
    if isinstance(target, str):
        target = OLD_TARGETS.get(target, OLD_DATA_TARGETS.get(target, target))
    return next((schema for schema in SCHEMAS.get(group, {}).values()
                 if schema.__dataclass_fields__["_target_"].default == target), None)


def register_schemas() -> None:
    """Store every schema as ``schema/<group>/<option>`` (idempotent: the store replaces an entry of that name)."""
    store = ConfigStore.instance()
    for group, options in SCHEMAS.items():
        for option, schema in options.items():
            store.store(group=f"schema/{group}", name=option, node=schema)
