"""The rules across keys of a composed config: what no single key's type or range can say (a re-mining setting a
data source cannot follow, a reranker's model with an embedder's loss, two sources of one learning rate or node
count). ``gte_pro.config.checks.config_problems`` runs each; every problem is one line naming the keys."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf


def mix_problems(cfg: DictConfig) -> list[str]:
    """Re-mining reads one token cache; a mix has one per source."""
    remine = OmegaConf.select(cfg, "data.remine", default=None)
    if OmegaConf.select(cfg, "data._target_", default=None) == "gte_pro.data.mix.MixDataModule" and isinstance(
            remine, DictConfig) and (remine.get("every_n_epochs") or remine.get("at_start")):
        return ["data.remine: not supported with data=mix; set data.remine.every_n_epochs=0 "
                "data.remine.at_start=false"]
    return []


CROSS_ENCODER = "gte_pro.models.cross_encoder.CrossEncoder"
RERANK_LOSSES = "gte_pro.training.losses_rerank."


def task_problems(cfg: DictConfig) -> list[str]:
    """task=rerank trains (mode=train) or evaluates (mode=eval) a cross-encoder with a reranking loss; task=embed
    neither."""
    task = cfg.get("task", "embed")
    model = OmegaConf.select(cfg, "model._target_", default=None, throw_on_missing=False)
    loss = OmegaConf.select(cfg, "loss._target_", default=None, throw_on_missing=False)
    rerank = task == "rerank"
    problems = []
    if isinstance(model, str) and (model == CROSS_ENCODER) != rerank:
        problems.append(f"model: task={task} trains " + (
            "a cross-encoder: choose model=reranker_minilm, reranker_tiny, gte_reranker_modernbert, "
            "gte_multilingual_reranker, bge_reranker_base or cross_encoder model.name_or_path=..." if rerank else
            f"an embedder, and {model} is a reranker: add task=rerank, or choose an embedder (model=minilm, ...)"))
    if isinstance(loss, str) and loss.startswith(RERANK_LOSSES) != rerank:
        problems.append(f"loss: task={task} " + ("needs a reranking loss: loss=listwise or loss=pointwise_bce"
                                                   if rerank else f"trains an embedder; {loss} is a reranker's loss"))
    if rerank and cfg.get("mode", "train") not in ("train", "eval"):
        problems.append(f"mode={cfg.get('mode')}: task=rerank runs mode=train or mode=eval (both rerank "
                        "eval.retriever's candidates); a trained reranker scores with mode=score or mine.rescore_with")
    if rerank and OmegaConf.select(cfg, "data.remine.every_n_epochs", default=0):
        problems.append("data.remine: re-mining refreshes an embedder's negatives; with task=rerank mine them first "
                        "(mode=mine) and set data.remine.every_n_epochs=0")
    return problems


def remine_problems(cfg: DictConfig) -> list[str]:
    """A teacher rescores the window in mode=mine only: re-mining during training mines with the embedder alone,
    each rank embedding its share of the corpus, which FSDP's sharded weights cannot do outside the training step."""
    remine = OmegaConf.select(cfg, "data.remine", default=None)
    if not (isinstance(remine, DictConfig) and (remine.get("every_n_epochs") or remine.get("at_start"))):
        return []
    problems = []
    teacher = OmegaConf.select(cfg, "mine.rescore_with", default=None, throw_on_missing=False)
    if teacher is not None:
        problems.append(f"mine.rescore_with={teacher!r}: not supported with data.remine (re-mining during training "
                        "mines with the embedder alone); mine with the teacher once (mode=mine "
                        "mine.rescore_with=...) and train on its file, or set mine.rescore_with=null")
    strategy = str(OmegaConf.select(cfg, "strategy._target_", default="") or "")
    if strategy.endswith("FSDPStrategy"):
        problems.append("data.remine: not supported with strategy=fsdp (each rank would embed the corpus with its "
                        "shards of the weights); use strategy=ddp, or mine between runs (mode=mine) and set "
                        "data.remine.every_n_epochs=0 data.remine.at_start=false")
    return problems


def lr_problems(cfg: DictConfig) -> list[str]:
    """The learning rate has one source of truth, model.lr (sweeps and lr_find set it; the module hands it to the
    optimizer): an optimizer.lr of another value would be silently replaced."""
    optimizer_lr = OmegaConf.select(cfg, "optimizer.lr", default=None, throw_on_missing=False)
    model_lr = OmegaConf.select(cfg, "model.lr", default=None, throw_on_missing=False)
    if optimizer_lr is None or optimizer_lr == model_lr:
        return []
    return [f"optimizer.lr={optimizer_lr!r} differs from model.lr={model_lr!r}: the learning rate is model.lr "
            f"alone (optimizer.lr follows it); set model.lr={optimizer_lr} instead"]


def topology_problems(cfg: DictConfig) -> list[str]:
    """``nodes`` is the one source of the node count: the trainer's num_nodes follows it."""
    nodes = OmegaConf.select(cfg, "nodes", default=None, throw_on_missing=False)
    num_nodes = OmegaConf.select(cfg, "trainer.num_nodes", default=None, throw_on_missing=False)
    if nodes is None or num_nodes is None or num_nodes == nodes:
        return []
    return [f"trainer.num_nodes={num_nodes!r} differs from nodes={nodes!r}: the node count is `nodes` alone "
            f"(trainer.num_nodes and hydra.launcher.nodes follow it); set nodes={num_nodes} instead"]


def matryoshka_problems(cfg: DictConfig) -> list[str]:
    """One weight per Matryoshka dimension, and no weights without dimensions."""
    dims = OmegaConf.select(cfg, "loss.matryoshka_dims", default=None, throw_on_missing=False)
    weights = OmegaConf.select(cfg, "loss.matryoshka_weights", default=None, throw_on_missing=False)
    if weights is not None and not dims:
        return [f"loss.matryoshka_weights={list(weights)}: set but loss.matryoshka_dims is not; give the dimensions "
                "(e.g. loss.matryoshka_dims=[384,256,128]) or drop the weights"]
    if dims and weights is not None and len(weights) != len(dims):
        return [f"loss.matryoshka_weights={list(weights)}: expected one weight per dimension of "
                f"loss.matryoshka_dims={list(dims)}"]
    return []


def mine_window_problems(cfg: DictConfig) -> list[str]:
    """The rank window [mine.range_min, mine.range_max) is not empty and holds mine.num_negatives."""
    low = OmegaConf.select(cfg, "mine.range_min", default=None, throw_on_missing=False)
    high = OmegaConf.select(cfg, "mine.range_max", default=None, throw_on_missing=False)
    wanted = OmegaConf.select(cfg, "mine.num_negatives", default=None, throw_on_missing=False)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high, wanted)):
        return []  # a bad value of one of them is named by its own rule
    if low >= high:
        return [f"mine.range_min={low}: must be smaller than mine.range_max={high}"]
    if wanted > high - low:
        return [f"mine.num_negatives={wanted}: more than the window holds (mine.range_max - mine.range_min = "
                f"{high - low})"]
    return []
