"""The data module a run's ``data.*`` settings make, from its parts (``gte_pro.data``): the row source that
``data._target_`` names (built with the option's own keys), the token cache, the batching and the validation sets.

The schemas (``gte_pro.config.schema``) are the only defaults: a ``data=mix`` source's keys are its type's
schema's defaults, then the mix's shared keys, then its own; a data module for direct use (tests, benchmarks,
scripts: :func:`data_module`) takes the schema's defaults for what it is not given. No part keeps a default of its
own. A run builds one data module (``gte_pro.modes.build``), which the pre-flight reads before the model loads.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import MISSING, asdict, fields, is_dataclass
from typing import Any

from hydra.utils import get_class
from omegaconf import MISSING as REQUIRED
from omegaconf import DictConfig, OmegaConf

from gte_pro.config.schema import SCHEMAS
from gte_pro.config.schema.run import RunSchema
from gte_pro.data.base import ContrastiveDataModule
from gte_pro.data.batching import Batching, LoaderOptions
from gte_pro.data.collaborators import CandidateSource, EvalSetSource, NegativePool, PairJoiner
from gte_pro.data.mix import MIX_ONLY, MixDataModule, check_source_name, named_errors
from gte_pro.data.token_cache import Decontamination, TokenCache, Tokenization
from gte_pro.data.validation import Validation
from gte_pro.errors import DataError
from gte_pro.launch.renamed import RENAMED_TARGETS

MIX = "mix"
# the kinds a mix's source may be, in the order errors list them (every data option but the mix)
SOURCE_KINDS = ("jsonl", "hf", "beir", "demo")
# the keys of DataCommon that no part of the data module reads: data.remine is the training loop's
# (gte_pro.mining.remine); what the model hands over (the tokenizer, its prompts) and the run's seed come as arguments
READ_ELSEWHERE = frozenset({"remine", "_target_"})
# what higher floors hand a data module besides its settings (gte_pro.data.collaborators; the distillation loss)
HANDED = frozenset({"negative_pool", "pair_join", "candidates", "eval_sets", "distill_loss"})


def _defaults(option: str) -> dict[str, Any]:
    """name -> default of every key of ``data=<option>``'s schema (MISSING where the user must give one)."""
    out = {}
    for item in fields(SCHEMAS["data"][option]):
        default = item.default if item.default is not MISSING else (
            item.default_factory() if item.default_factory is not MISSING else MISSING)
        # a nested group (data.columns, data.remine) as the composed config holds it: a mapping; the schema's
        # "???" (omegaconf.MISSING): a key the user must give
        out[item.name] = asdict(default) if is_dataclass(default) else MISSING if default == REQUIRED else default
    return out


def _option_of(target: str) -> str:
    """The data option (``demo``, ``jsonl``, ...) whose schema names ``target`` (or named it: ``RENAMED_TARGETS``)."""
    target = RENAMED_TARGETS.get(target, target)
    for option, schema in SCHEMAS["data"].items():
        if schema.__dataclass_fields__["_target_"].default == target:
            return option
    raise DataError(f"data._target_={target!r}: not a data source; valid choices: "
                    f"{', '.join(s.__dataclass_fields__['_target_'].default for s in SCHEMAS['data'].values())}")


def _own_part(option: str, settings: Mapping[str, Any]) -> Any:
    """The part ``data=<option>``'s ``_target_`` names (a row source; a mix's ``Mixing``), built with the keys it
    takes."""
    target = get_class(SCHEMAS["data"][option].__dataclass_fields__["_target_"].default)
    own = [name for name in inspect.signature(target.__init__).parameters if name != "self"]
    return target(**{key: settings[key] for key in own})


def build_datamodule(cfg: DictConfig, tokenizer: Any, query_prefix: str = "", doc_prefix: str = "",
                     **collaborators: Any) -> ContrastiveDataModule | MixDataModule:
    """The configured data module (``data/``), tokenizing with ``tokenizer`` and the model's prompts;
    ``collaborators``: what higher floors hand it (``negative_pool``, ``pair_join``, ``candidates``, ``eval_sets``,
    ``distill_loss``), given here once and never set on it afterwards."""
    settings = OmegaConf.to_container(cfg.data, resolve=True)
    return datamodule_of(settings, tokenizer, query_prefix, doc_prefix, int(cfg.seed), **collaborators)


def data_module(option: str, tokenizer: Any = None, *, query_prefix: str = "", doc_prefix: str = "",
                seed: int = RunSchema.seed, **keys: Any) -> ContrastiveDataModule | MixDataModule:
    """``data=<option>`` for direct use: the schema's defaults, then ``keys`` (``data.cache_dir`` unset:
    ``$GTE_PRO_CACHE``), e.g. ``data_module("jsonl", tokenizer, train_file="pairs.jsonl", batch_size=8)``;
    ``keys`` may also name the collaborators of :func:`datamodule_of`."""
    defaults = {key: value for key, value in _defaults(option).items() if value is not MISSING}
    defaults["cache_dir"] = None  # the schema's ${paths.cache_dir}: no run, no paths
    handed = {key: keys.pop(key) for key in list(keys) if key in HANDED}
    return datamodule_of({**defaults, **keys}, tokenizer, query_prefix, doc_prefix, seed, **handed)


def datamodule_of(settings: Mapping[str, Any], tokenizer: Any, query_prefix: str, doc_prefix: str, seed: int, *,
                  negative_pool: NegativePool | None = None, pair_join: PairJoiner | None = None,
                  candidates: CandidateSource | None = None, eval_sets: EvalSetSource | None = None,
                  distill_loss: str | None = None) -> ContrastiveDataModule | MixDataModule:
    """The data module of complete ``data.*`` settings (every key of its option's schema)."""
    option = _option_of(str(settings["_target_"]))
    shared = {**settings, "query_prefix": query_prefix, "doc_prefix": doc_prefix, "seed": seed}
    batching = _batching(shared, negative_pool, pair_join)
    validation = _validation(shared, pair_join, candidates, eval_sets)
    if option != MIX:
        return _module(option, shared, tokenizer, batching, validation, eval_sets, distill_loss)
    sources = {}
    for name, spec in _source_specs(settings.get("sources")).items():
        kind, options = _source_options(name, spec)
        with named_errors(name):
            merged = {**_defaults(kind), **{k: v for k, v in shared.items() if k != "_target_"}, **options}
            # a source's collaborators are the mix's: its batches are the mix's, its named sets the mix's
            sources[name] = _module(kind, merged, tokenizer, _batching(merged, None, None),
                                    _validation(merged, None, None, None), eval_sets, distill_loss)
    return MixDataModule(sources, _own_part(MIX, settings), batching, validation, _form(shared, tokenizer))


def _form(settings: Mapping[str, Any], tokenizer: Any) -> Tokenization:
    return Tokenization(tokenizer, int(settings["max_length"]), str(settings["query_prefix"] or ""),
                        str(settings["doc_prefix"] or ""))


def _loader(settings: Mapping[str, Any]) -> LoaderOptions:
    return LoaderOptions(int(settings["num_workers"]), bool(settings["pin_memory"]),
                         bool(settings["persistent_workers"]))


def _batching(settings: Mapping[str, Any], negative_pool: Any, pair_join: Any) -> Batching:
    return Batching(batch_size=int(settings["batch_size"]), num_negatives=settings["num_negatives"],
                    group_by_length=bool(settings["group_by_length"]), length_window=int(settings["length_window"]),
                    seed=int(settings["seed"]), loader=_loader(settings), negative_pool=negative_pool,
                    pair_join=pair_join)


def _validation(settings: Mapping[str, Any], pair_join: Any, candidates: Any, eval_sets: Any) -> Validation:
    return Validation(eval_batch_size=int(settings["eval_batch_size"]), val_distractors=settings["val_distractors"],
                      loader=_loader(settings), pair_join=pair_join, candidates=candidates, eval_sets=eval_sets)


def _module(option: str, settings: Mapping[str, Any], tokenizer: Any, batching: Batching, validation: Validation,
            eval_sets: Any, distill_loss: str | None) -> ContrastiveDataModule:
    source = _own_part(option, settings)
    decontamination = Decontamination(str(settings["decontaminate"]), float(settings["decontaminate_threshold"]),
                                      int(settings["decontaminate_num_perm"]))
    tokens = TokenCache(form=_form(settings, tokenizer), min_query_chars=int(settings["min_query_chars"]),
                        min_doc_chars=int(settings["min_doc_chars"]), val_fraction=float(settings["val_fraction"]),
                        max_val_queries=settings["max_val_queries"], max_train_rows=settings["max_train_rows"],
                        cache_dir=settings["cache_dir"], decontamination=decontamination, eval_sets=eval_sets)
    return ContrastiveDataModule(source, tokens, batching, validation, distill_loss)


# --- data=mix: each source's keys --------------------------------------------------------------------------------
def _source_specs(sources: Any) -> dict[str, Any]:
    sources = OmegaConf.to_container(sources, resolve=True) if OmegaConf.is_config(sources) else sources
    if not isinstance(sources, Mapping) or not sources:
        kinds = "|".join(SOURCE_KINDS)
        raise DataError(f"data.sources={sources!r}: expected at least one source, as name -> {{type: {kinds}, "
                        "<its keys>}, e.g. data.sources='{qa: {type: jsonl, train_file: qa.jsonl}}'")
    return {str(name): spec for name, spec in sources.items()}


def _source_options(name: str, spec: Any) -> tuple[str, dict[str, Any]]:
    """(type, its own options) of ``data.sources.<name>``; every bad key is a DataError naming it."""
    where = f"data.sources.{name}"
    check_source_name(name)
    kinds = SOURCE_KINDS
    if not isinstance(spec, Mapping):
        raise DataError(f"{where}={spec!r}: expected a mapping {{type: {'|'.join(kinds)}, <its keys>}}")
    options = {str(key): value for key, value in spec.items()}
    kind = options.pop("type", None)
    if kind not in kinds:
        got = " is required" if kind is None else f"={kind!r} is not a source type"
        raise DataError(f"{where}.type{got}; valid choices: {', '.join(kinds)}")
    defaults = _defaults(kind)
    accepted = set(defaults) - READ_ELSEWHERE | {"query_prefix"}
    for key in options:
        if key in MIX_ONLY:
            raise DataError(f"{where}.{key}: shared by all sources of a mix; set data.{key} instead")
        if key not in accepted:
            raise DataError(f"{where}.{key}: not a setting of a {kind} source; valid keys: type, "
                            f"{', '.join(sorted(accepted - MIX_ONLY))}")
    missing = sorted(key for key, value in defaults.items() if value is MISSING and key not in options)
    if missing:
        raise DataError(f"{where}.{missing[0]} is required for a {kind} source (see conf/data/{kind}.yaml)")
    return kind, options
