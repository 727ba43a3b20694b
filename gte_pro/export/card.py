"""The model card: ``README.md`` of the sentence-transformers folder (what it was trained from, on what, how, and
how well), from the run's config and summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.utils import get_class
from omegaconf import DictConfig

from gte_pro.models.encoder import Encoder
from gte_pro.utils.files import write_text_atomic
from gte_pro.utils.tables import markdown_table


def _source_name(target: str | None) -> str:
    """The data source as cards have always named it (``module_name`` of the project's sources: ``JsonlDataModule``,
    ...), or a class of the user's own by its name."""
    if str(target).startswith("gte_pro.data."):
        return str(get_class(str(target)).module_name)
    return _short(target)


def _short(target: str | None) -> str:
    return str(target or "").rsplit(".", 1)[-1]


def card_sections(cfg: DictConfig, summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Base model, data, loss and hyper-parameter rows of the model card, from the run's config and summary."""
    model, data = cfg.model, cfg.data
    base = str(model.name_or_path)
    if model.get("random_init_config"):
        fields = dict(model.random_init_config)
        base = (f"a randomly initialised {fields.get('model_type', 'bert')} ({fields.get('num_hidden_layers', '?')} "
                f"layers, hidden size {fields.get('hidden_size', '?')}) with the tokenizer of {Path(base).name}")
    sources = {key: str(data[key]) for key in ("path", "train_file", "val_file", "name") if data.get(key)}
    kept = "; ".join(f"{r['source']}: {r['kept']} of {r['read']} rows kept" for r in summary.get("data") or [])
    scheduler = cfg.get("scheduler")
    hyper = {
        "learning rate": summary.get("lr"), "batch size per device": data.batch_size,
        "devices": summary.get("world_size"),
        "hard negatives per query": summary.get("num_negatives", data.num_negatives),
        "max length": data.max_length, "epochs": cfg.trainer.max_epochs, "optimizer steps": summary.get("global_step"),
        "precision": cfg.trainer.precision, "optimizer": _short(cfg.optimizer.get("_target_")),
        "weight decay": cfg.optimizer.get("weight_decay"),
        "scheduler": _short(scheduler.fn.get("_target_")) if scheduler else "none",
        "warmup ratio": scheduler.get("warmup_ratio") if scheduler else 0, "seed": cfg.seed,
    }
    return {
        "base_model": base,
        "data": {"source": _source_name(data.get("_target_")), **sources, "cleaning": kept or "n/a"},
        "loss": {"loss": _short(cfg.loss.get("_target_")), "temperature": cfg.loss.get("temperature"),
                 "negatives gathered across devices": cfg.loss.get("gather_across_devices"),
                 **({"matryoshka dims": list(cfg.loss.matryoshka_dims)} if cfg.loss.get("matryoshka_dims") else {})},
        "hyperparameters": hyper,
    }


def _markdown_rows(rows: dict[str, Any]) -> str:
    return markdown_table(["", ""], [(key, _code(value)) for key, value in rows.items()])


def _code(value: Any) -> str:
    """Non-empty strings (names, paths, prefixes) as code, so that markdown leaves them as they are; other values as
    Python prints them (a temperature of 0.05 stays 0.05)."""
    return f"`{value}`" if isinstance(value, str) and value else str(value)


def _truncation_note(folder: Path, loss: dict[str, Any]) -> list[str]:
    """Matryoshka training: how to load shorter embeddings (the per-dimension metrics are the dim<d> rows above)."""
    dims = loss.get("matryoshka dims")
    if not dims:
        return []
    return [f"Trained with Matryoshka dimensions {', '.join(map(str, dims))}: the first d dimensions of an embedding "
            "work on their own (rows `dim<d>` of the evaluation table). Load them truncated with", "", "```python",
            f'model = SentenceTransformer("{folder}", truncate_dim={min(dims)})', "```", ""]


def write_model_card(folder: str | Path, encoder: Encoder, *, base_model: str, data: dict[str, Any],
                     loss: dict[str, Any], hyperparameters: dict[str, Any], metrics_md: str) -> Path:
    """``README.md`` of the sentence-transformers folder: what it was trained from, on what, how, and how well."""
    folder = Path(folder)
    hub_base = base_model if not Path(base_model).exists() and base_model.count("/") == 1 else None
    front = ["---", "library_name: sentence-transformers", "pipeline_tag: sentence-similarity",
             "tags: [sentence-transformers, feature-extraction, sentence-similarity, gte-pro]"]
    front += [f"base_model: {hub_base}"] if hub_base else []
    model = {"base model": base_model, "embedding dimension": encoder.dim, "pooling": encoder.pooling,
             "normalized": encoder.normalize, "max sequence length": encoder.max_length,
             "query prefix": encoder.query_prefix, "document prefix": encoder.doc_prefix,
             **({"projection head": str(encoder.projection_settings)} if encoder.projection_settings else {})}
    card = "\n".join([
        *front, "---", "", f"# {folder.parent.name}/{folder.name}", "",
        "A text embedding model fine-tuned with contrastive learning by gte-pro (Hydra + PyTorch Lightning).", "",
        "## Model", "", _markdown_rows(model), "## Training data", "", _markdown_rows(data),
        "## Loss", "", _markdown_rows(loss), "## Hyper-parameters", "", _markdown_rows(hyperparameters),
        "## Evaluation", "", "Retrieval metrics at the end of training (binary relevance, the definitions of "
        "sentence-transformers' `InformationRetrievalEvaluator`):", "", metrics_md,
        "## Usage", "", "```python", "from sentence_transformers import SentenceTransformer", "",
        f'model = SentenceTransformer("{folder}")',
        'queries = model.encode(["how do I sort a list?"], prompt_name="query")' if encoder.query_prefix
        else 'queries = model.encode(["how do I sort a list?"])',
        'docs = model.encode(["sorted() returns a new sorted list."], prompt_name="document")' if encoder.doc_prefix
        else 'docs = model.encode(["sorted() returns a new sorted list."])',
        "print(model.similarity(queries, docs))", "```", "", *_truncation_note(folder, loss),
    ])
    return write_text_atomic(folder / "README.md", card)
