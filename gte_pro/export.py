"""Exporting a trained encoder so that other tools load it offline, and proving that they reproduce it.

The sentence-transformers layout written here is the classic one (modules.json + 1_Pooling + 2_Normalize), which
every sentence-transformers release from 2.x to 6.x reads. The plain Hugging Face layout and ONNX are optional;
``verify_export`` compares any export's embeddings with the module's.
"""

from __future__ import annotations

import json
import logging
import shutil
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from gte_pro.model import Encoder

log = logging.getLogger(__name__)

Embedder = Callable[[Sequence[str]], torch.Tensor]  # texts -> (N, dim) embeddings

_ST_POOLING_FLAGS = {
    "mean": "pooling_mode_mean_tokens",
    "cls": "pooling_mode_cls_token",
    "last": "pooling_mode_lasttoken",
}


def _write_json(path: Path, blob: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(blob, indent=2) + "\n")


def export_sentence_transformers(encoder: Encoder, folder: str | Path) -> Path:
    """Write ``encoder`` so that ``SentenceTransformer(folder)`` reproduces its embeddings.

    Written to a sibling temp folder first and renamed, so that a crash never leaves a half-written model where
    a previous export was.
    """
    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    encoder.save(tmp)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if encoder.normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (tmp / "2_Normalize").mkdir(parents=True, exist_ok=True)
    _write_json(tmp / "modules.json", modules)
    _write_json(tmp / "sentence_bert_config.json", {"max_seq_length": encoder.max_length, "do_lower_case": False})
    pooling = {flag: False for flag in ("pooling_mode_cls_token", "pooling_mode_mean_tokens",
                                        "pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                                        "pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken")}
    pooling[_ST_POOLING_FLAGS[encoder.pooling]] = True
    _write_json(tmp / "1_Pooling" / "config.json",
                {"word_embedding_dimension": encoder.dim, **pooling, "include_prompt": True})
    prompts = {"query": encoder.query_prefix, "document": encoder.doc_prefix}
    _write_json(tmp / "config_sentence_transformers.json",
                {"prompts": prompts, "default_prompt_name": None, "similarity_fn_name": "cosine"})
    _replace(tmp, folder)
    log.info("exported sentence-transformers model to %s", folder)
    return folder


# --- plain Hugging Face layout ---------------------------------------------------------------------------------
POOLING_FILE = "gte_pro_pooling.json"

# The pooling code that <hf>/README.md documents. hf_embedder runs this very code, so the verification of the HF
# export also proves the documentation right (one copy of the pooling logic outside gte_pro.model).
_HF_POOLING_CODE = """import json, torch, torch.nn.functional as F
from transformers import AutoModel, AutoTokenizer

folder = {folder!r}
settings = json.load(open(f"{{folder}}/{pooling_file}"))
tokenizer, model = AutoTokenizer.from_pretrained(folder), AutoModel.from_pretrained(folder).eval()

def embed(texts):
    batch = tokenizer(list(texts), padding=True, truncation=True, max_length=settings["max_length"],
                      return_tensors="pt")
    with torch.inference_mode():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    if settings["pooling"] == "mean":
        emb = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    elif settings["pooling"] == "cls":
        emb = hidden[:, 0]
    else:  # "last": the last real token (right padding)
        emb = hidden[torch.arange(len(hidden)), batch["attention_mask"].sum(1) - 1]
    return F.normalize(emb, dim=-1) if settings["normalize"] else emb
"""

_HF_README = """# Plain Hugging Face layout

Backbone and tokenizer as `save_pretrained` writes them. The embedding is the backbone's last hidden state,
pooled and normalised as `{pooling_file}` says (pooling `{pooling}`, normalize `{normalize}`, max_length
{max_length}, query prefix {query_prefix!r}, document prefix {doc_prefix!r}):

```python
{code}
embeddings = embed(["a query", "a document"])
```
"""


def pooling_settings(encoder: Encoder) -> dict[str, Any]:
    return {"pooling": encoder.pooling, "normalize": encoder.normalize, "max_length": encoder.max_length,
            "query_prefix": encoder.query_prefix, "doc_prefix": encoder.doc_prefix, "dim": encoder.dim}


def export_hf(encoder: Encoder, folder: str | Path) -> Path:
    """``save_pretrained`` of backbone and tokenizer, ``gte_pro_pooling.json`` and a README with the pooling code."""
    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    encoder.save(tmp)
    settings = pooling_settings(encoder)
    _write_json(tmp / POOLING_FILE, settings)
    code = _HF_POOLING_CODE.format(folder=".", pooling_file=POOLING_FILE)
    (tmp / "README.md").write_text(_HF_README.format(pooling_file=POOLING_FILE, code=code, **settings))
    _replace(tmp, folder)
    log.info("exported Hugging Face model to %s", folder)
    return folder


def _replace(tmp: Path, target: Path) -> None:
    """Swap a finished temp folder/file in for ``target``: a crash never leaves half an export in its place."""
    if target.is_dir():
        shutil.rmtree(target)
    tmp.replace(target)


def hf_embedder(folder: str | Path) -> Embedder:
    """Embeddings computed by the code the HF folder's README documents (plain transformers, no gte_pro code)."""
    namespace: dict[str, Any] = {}
    exec(_HF_POOLING_CODE.format(folder=str(folder), pooling_file=POOLING_FILE), namespace)  # our own template
    return namespace["embed"]


# --- ONNX --------------------------------------------------------------------------------------------------------
class _OnnxGraph(nn.Module):
    """Backbone + pooling + normalisation with positional inputs, as the ONNX graph computes them."""

    def __init__(self, encoder: Encoder) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask)


def export_onnx(encoder: Encoder, path: str | Path, opset: int = 17) -> Path:
    """One ONNX graph (inputs ``input_ids``, ``attention_mask``; output ``embeddings``) with dynamic batch and
    sequence axes; pooling settings go into the model's metadata. Needs ``onnx`` (``pip install -e '.[export]'``).
    """
    import onnx

    path = Path(path)
    tmp = path.with_name(path.stem + ".tmp.onnx")
    was_training = encoder.training
    encoder.eval()
    # trace with a padded batch: traced on a batch without padding, the attention mask could drop out of the graph
    sample = encoder.tokenize(["a short text", "a longer text, so that the short one above gets padded"])
    device = next(encoder.parameters()).device
    args = (sample["input_ids"].to(device), sample["attention_mask"].to(device))
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"},
            "embeddings": {0: "batch"}}
    try:
        with torch.no_grad(), warnings.catch_warnings():
            # the TorchScript exporter (no onnxscript needed) warns about its deprecation and about python branches
            # in the traced code; the export is checked against the module right after, which is what matters
            warnings.simplefilter("ignore")
            torch.onnx.export(_OnnxGraph(encoder), args, str(tmp), dynamo=False, input_names=["input_ids",
                              "attention_mask"], output_names=["embeddings"], dynamic_axes=axes, opset_version=opset)
    finally:
        encoder.train(was_training)
    model = onnx.load(str(tmp), load_external_data=False)
    for key, value in pooling_settings(encoder).items():
        model.metadata_props.add(key=key, value=json.dumps(value))
    onnx.save(model, str(tmp))
    tmp.replace(path)
    log.info("exported ONNX model to %s", path)
    return path


def onnx_embedder(path: str | Path, tokenizer_folder: str | Path) -> Embedder:
    """Embeddings from onnxruntime (CPU) with the tokenizer of the exported folder."""
    import onnxruntime
    from transformers import AutoTokenizer

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    max_length = int(json.loads(session.get_modelmeta().custom_metadata_map["max_length"]))
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_folder))

    def embed(texts: Sequence[str]) -> torch.Tensor:
        batch = tokenizer(list(texts), padding=True, truncation=True, max_length=max_length, return_tensors="np")
        feeds = {"input_ids": batch["input_ids"].astype(np.int64),
                 "attention_mask": batch["attention_mask"].astype(np.int64)}
        return torch.from_numpy(session.run(["embeddings"], feeds)[0])

    return embed


# --- verification ------------------------------------------------------------------------------------------------
# short and long (truncated), code, non-Latin: texts whose embeddings every export must reproduce
VERIFY_TEXTS = (
    "How do I sort a dictionary by value?",
    "Return a new list containing all items from the iterable in ascending order.",
    "tiny",
    "query: what is the capital of France?",
    "Paris is the capital and most populous city of France. " * 60,
    "Ünïcödé, emoji 🙂 and CJK 文本 survive tokenization.",
    "def f(x):\n    return x * 2  # code, with a newline",
)


class ExportMismatchError(RuntimeError):
    """An export does not reproduce the module's embeddings."""


def st_embedder(folder: str | Path) -> Embedder:
    """Embeddings from ``SentenceTransformer(folder)`` on the CPU."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    return lambda texts: model.encode(list(texts), convert_to_tensor=True).cpu()


def verify_export(name: str, reference: torch.Tensor, embed: Embedder, texts: Sequence[str] = VERIFY_TEXTS,
                  min_cosine: float = 0.9999) -> float:
    """Worst cosine between ``reference`` (the module's embeddings of ``texts``) and the export's; raise below
    ``min_cosine``. The export sees a batch of one and a padded batch, so fixed shapes or a lost mask show up.
    Norms are compared too: cosine alone cannot see a missing normalisation.
    """
    theirs = torch.cat([embed(texts[:1]), embed(texts[1:])]).float().cpu()
    reference = reference.float().cpu()
    if theirs.shape != reference.shape:
        raise ExportMismatchError(f"{name} export: embeddings of shape {tuple(theirs.shape)}, the module's are "
                                  f"{tuple(reference.shape)}")
    cosine = F.cosine_similarity(theirs, reference, dim=-1)
    worst = int(cosine.argmin())
    norm_gap = float(((theirs.norm(dim=-1) - reference.norm(dim=-1)).abs() / reference.norm(dim=-1)).max())
    if float(cosine[worst]) < min_cosine or norm_gap > 1e-3:
        raise ExportMismatchError(f"{name} export does not reproduce the module: cosine {float(cosine[worst]):.6f} "
                                  f"(need >= {min_cosine}) on text {worst} {texts[worst][:50]!r}, largest relative "
                                  f"norm difference {norm_gap:.2e}")
    log.info("%s export verified: worst cosine %.7f over %d texts", name, float(cosine[worst]), len(texts))
    return float(cosine[worst])


# --- model card --------------------------------------------------------------------------------------------------
def _markdown_rows(rows: dict[str, Any]) -> str:
    return "| | |\n|---|---|\n" + "".join(f"| {key} | {_cell(value)} |\n" for key, value in rows.items())


def _cell(value: Any) -> str:
    return f"`{value}`" if isinstance(value, str) and value else str(value).replace("|", "\\|")


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
             "query prefix": encoder.query_prefix, "document prefix": encoder.doc_prefix}
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
        "print(model.similarity(queries, docs))", "```", "",
    ])
    (folder / "README.md").write_text(card)
    return folder / "README.md"
