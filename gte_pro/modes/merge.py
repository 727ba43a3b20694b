"""``mode=merge``: a model soup of fine-tunes of one base model (Wortsman et al. 2022, "Model soups: averaging
weights of multiple fine-tuned models improves accuracy without increasing inference time", ICML).

    python train.py mode=merge merge.models=[<run A>/model,<run B>/model] merge.method=greedy

1. The members' folders are checked for one architecture (config.json, the sentence-transformers files, every
   tensor's name, dtype and shape from the safetensors headers) before any weight is read (``gte_pro.models.soup``).
2. Each member is validated on the run's validation, as training validates: the data's held-out split and any
   ``eval.beir`` sets, through the same Lightning module and ``Trainer.validate`` as mode=train and mode=eval.
3. The soup: ``uniform`` (the mean of every floating tensor), ``greedy`` (Wortsman's greedy soup: the members sorted
   by their validation ``optimized_metric`` (val/ndcg@10), best first; each next one is kept when the soup with it
   scores at least as well as the soup without it (>=, as in the paper's recipe), else skipped, and the loop goes on
   through every member), or ``slerp`` (two members, ``merge.slerp_t``).
4. The soup is written and verified as a training run's model is (``gte_pro.export``: ``<run dir>/model`` and the
   exports of ``export/``, each checked against the soup's embeddings, the model card, the deployment checks), with
   ``metrics.json`` (the soup's and each member's validation, greedy's steps) and ``metrics.md``.

One process: the members are small enough to validate one after another (devices=1).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, open_dict

from gte_pro.errors import ConfigError
from gte_pro.evaluation.report import merge_results, metrics_table, optimized_value
from gte_pro.evaluation.sets import eval_set_source
from gte_pro.export.release import check_export_requirements, release
from gte_pro.export.writers import export_sentence_transformers
from gte_pro.models.encoder import Encoder
from gte_pro.models.soup import (
    check_buffers,
    check_members,
    encoder_tensors,
    load_encoder_tensors,
    slerp,
    uniform,
)
from gte_pro.modes.build import build_data_for, build_encoder, build_module, build_trainer, start_run
from gte_pro.utils.files import write_json_atomic, write_text_atomic
from gte_pro.utils.tables import markdown_table

log = logging.getLogger(__name__)

State = dict[str, torch.Tensor]
Validate = Callable[[Mapping[str, torch.Tensor]], dict[str, float]]
# keys of model/ that would build another network than the member's folder holds, or override what its files say
FROM_THE_FOLDER = ("random_init_config", "lora", "projection", "pooling", "normalize")


def member_folders(cfg: DictConfig) -> list[Path]:
    """``merge.models`` as folders; ``ConfigError`` for fewer than two, a repeated one, slerp of other than two, a
    task other than embed or more than one process."""
    options = cfg.merge
    folders = [Path(str(name)).expanduser() for name in options.get("models") or []]
    if len(folders) < 2:
        raise ConfigError(f"merge.models: {len(folders)} model(s); mode=merge needs at least two",
                          hint="set merge.models=[<run A>/model,<run B>/model]")
    if len({folder.resolve() for folder in folders}) < len(folders):
        raise ConfigError("merge.models: a folder is named twice", hint="name each member once")
    if options.method == "slerp" and len(folders) != 2:
        raise ConfigError(f"merge.method=slerp interpolates exactly two models; merge.models has {len(folders)}",
                          hint="give two members for slerp, or merge.method=uniform|greedy for more")
    if cfg.task != "embed":
        raise ConfigError(f"mode=merge: task={cfg.task} is not supported; it merges embedders (task=embed)")
    if cfg.devices != 1 or cfg.nodes != 1:
        raise ConfigError("mode=merge runs in one process; devices and nodes must be 1",
                          hint="set devices=1 nodes=1 (the members are validated one after another)")
    return folders


def member_config(cfg: DictConfig, folder: Path) -> DictConfig:
    """``cfg`` with ``model.name_or_path`` the member's folder, and the keys that its files decide left to them."""
    member = cfg.copy()
    with open_dict(member):
        member.model.name_or_path = str(folder)
        for key in FROM_THE_FOLDER:
            if key in member.model:
                member.model[key] = None
    return member


def member_state(cfg: DictConfig, folder: Path) -> State:
    """The member's tensors as the encoder names them (a copy on the CPU, its set-aside pooler included)."""
    return encoder_tensors(build_encoder(member_config(cfg, folder)))


def greedy_soup(states: Sequence[State], names: Sequence[str], scores: Sequence[float], validate: Validate,
                metric: str, first_val: dict[str, float]) -> tuple[State, dict[str, float], list[dict[str, Any]]]:
    """Wortsman's greedy soup: members best first; each kept when the soup with it scores >= the soup without it.
    The soup's weights, its validation and one record per step."""
    order = sorted(range(len(states)), key=lambda i: -scores[i])  # stable: a tie keeps merge.models' order
    kept, soup, soup_val = [order[0]], dict(states[order[0]]), first_val
    steps = [{"member": names[order[0]], metric: scores[order[0]], "soup": soup_val[metric], "kept": True}]
    log.info("greedy soup: start with %s (%s %.4f)", names[order[0]], metric, scores[order[0]])
    for index in order[1:]:
        candidate = uniform([states[i] for i in [*kept, index]])
        val = validate(candidate)
        keep = val[metric] >= soup_val[metric]
        steps.append({"member": names[index], metric: scores[index], "soup": val[metric], "kept": keep})
        log.info("greedy soup: + %s (%s %.4f): soup %.4f vs %.4f -> %s", names[index], metric, scores[index],
                 val[metric], soup_val[metric], "kept" if keep else "skipped")
        if keep:
            kept.append(index)
            soup, soup_val = candidate, val
    return soup, soup_val, steps


def merge(cfg: DictConfig) -> float | None:
    """Merge ``merge.models`` as ``merge.method`` says; write the soup, ``metrics.json`` and ``metrics.md``; return
    the soup's ``optimized_metric``."""
    folders = member_folders(cfg)
    check_members(folders)  # before any weight is read
    check_export_requirements(cfg.get("export"))
    method, metric = str(cfg.merge.method), str(cfg.get("optimized_metric") or "val/ndcg@10")
    output_dir, _ = start_run(cfg)
    names = [str(folder) for folder in folders]
    states = [member_state(cfg, folder) for folder in folders]
    check_buffers(states, names)
    first = member_config(cfg, folders[0])
    soup_encoder: Encoder = build_encoder(first)  # holds each set of weights in turn: the soup's at the end
    module = build_module(first, soup_encoder)
    datamodule = build_data_for(first, module, eval_sets=eval_set_source(first))
    trainer = build_trainer(first, callbacks=[], loggers=[])  # nothing is trained or logged

    def validate(state: Mapping[str, torch.Tensor]) -> dict[str, float]:
        load_encoder_tensors(soup_encoder, state)
        flat = merge_results(trainer.validate(module, datamodule=datamodule, verbose=False))
        optimized_value(flat, metric)  # a metric this validation does not log: an error naming those it does
        return flat

    members = [validate(state) for state in states]
    scores = [value[metric] for value in members]
    for name, score in zip(names, scores, strict=True):
        log.info("member %s: %s %.4f", name, metric, score)
    steps = None
    if method == "greedy":
        soup, soup_val, steps = greedy_soup(states, names, scores, validate, metric, members[scores.index(max(scores))])
    else:
        soup = uniform(states) if method == "uniform" else slerp(states, float(cfg.merge.slerp_t))
        soup_val = validate(soup)
    load_encoder_tensors(soup_encoder, soup)
    summary = {"mode": "merge", "method": method, "slerp_t": float(cfg.merge.slerp_t) if method == "slerp" else None,
               "metric": metric, "members": [{"model": name, "val": val} for name, val in zip(names, members,
                                                                                             strict=True)],
               "greedy_steps": steps, "val": soup_val, "val_before": None, "world_size": trainer.world_size,
               "parameters": {"total": sum(p.numel() for p in soup_encoder.parameters())}}
    export_soup(soup_encoder, output_dir, first, summary)
    return optimized_value(soup_val, metric)


def soup_table(summary: dict[str, Any]) -> str:
    """The members' and the soup's value of the metric (and greedy's kept/skipped), as a markdown table."""
    metric, steps = summary["metric"], {step["member"]: step for step in summary.get("greedy_steps") or []}
    rows = [[member["model"], member["val"][metric], *([steps[member["model"]]["soup"],
                                                          "kept" if steps[member["model"]]["kept"] else "skipped"]
                                                         if steps else [])] for member in summary["members"]]
    rows.append([f"soup ({summary['method']})", summary["val"][metric], *(["", ""] if steps else [])])
    columns = ["model", metric, *(["soup with it", "greedy"] if steps else [])]
    return markdown_table(columns, rows, numeric=[False, True, *([True, False] if steps else [])])


def export_soup(encoder: Encoder, output_dir: Path, cfg: DictConfig, summary: dict[str, Any]) -> None:
    """``model/`` and ``metrics.json`` first, then the same verified exports, model card and deployment checks as a
    training run's (``gte_pro.export.release``), recorded in ``metrics.json``; metrics.md holds the soup table."""
    model_dir = export_sentence_transformers(encoder, output_dir / "model")
    summary["model_dir"] = str(model_dir)
    write_json_atomic(output_dir / "metrics.json", summary)
    # raises (failing the run) if an export does not reproduce the soup; a fresh encoder of the first member's
    # architecture is what the state-dict round trip loads into
    summary["exports"] = release(encoder, output_dir, cfg, summary, fresh=lambda: build_encoder(cfg))
    write_json_atomic(output_dir / "metrics.json", summary)
    table = soup_table(summary)
    write_text_atomic(output_dir / "metrics.md", f"# Model soup ({summary['method']})\n\n{table}\n"
                      f"## The soup's validation\n\n{metrics_table(summary['val'])}")
    print(f"\n{table}\nmetrics: {output_dir / 'metrics.json'}\nmodel:   {model_dir}")
