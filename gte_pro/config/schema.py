"""The types and defaults of the config groups whose keys are ours: data, model, loss, eval, mine.

Each dataclass is a schema in Hydra's ConfigStore (``schema/<group>/<option>``) that the option's YAML file extends
(``defaults: [/schema/data/jsonl@_here_, _self_]``), so Hydra itself refuses ``data.batch_size=abc`` or
``loss.temperature=[1]`` while it composes, naming the key, and an option's YAML holds only its target and what it
changes. ``gte_pro.config.checks`` keeps what a type cannot say: ranges (``batch_size >= 2``), choices with their
valid values listed, and the rules across keys.

Typed ``Any`` on purpose:
- booleans: OmegaConf reads ``yes``, ``on`` and ``1`` as true, and a string must never switch
  ``model.trust_remote_code`` on; the checks accept only a real true/false;
- keys that take more than one type (``model.length_chunks``: auto or an integer; ``eval.beir``: folders or
  ``{path, split, name}``; ``data.sources``) and the trainer group, which passes any Lightning argument through;
- the dicts that default to null (``model.lora``, ``model.projection``, ``model.random_init_config``): OmegaConf 2.3
  cannot merge ``model.lora='{r: 16}'`` into a typed dict node that holds null (an AttributeError); their keys are
  checked against what the code takes.
"""

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import II, MISSING

FLAG = Any  # a boolean checked by gte_pro.config.checks (see the module docstring)


# --- data ---------------------------------------------------------------------------------------------------------
@dataclass
class Remine:
    """Re-mining during training: at the start of every ``every_n_epochs``-th epoch (0: off; and of the first epoch
    with ``at_start``) the training queries and corpus (every row's positives) are embedded with the current weights
    and each row's hard negatives are mined afresh with the ``mine.*`` options (rank window, margins, sampling);
    needs ``data.num_negatives > 0``. The pools are kept in ``<run dir>/negatives/``; the log and metrics.json say
    what each re-mine cost against its epoch."""

    every_n_epochs: int = 0
    at_start: FLAG = False


@dataclass
class DataCommon:
    """The keys every data source shares; ``conf/data/<option>.yaml`` extends its subclass below."""

    _target_: str = MISSING
    # the held-out validation split: a stable hash of the query picks val_fraction of the training queries (sources
    # with their own validation file/split use that instead); at most max_val_queries of them are scored
    val_fraction: float = 0.05
    max_val_queries: int | None = 1000
    # cap on the training rows read (null: all)
    max_train_rows: int | None = None
    # cleaning: rows whose query or every positive is shorter than this are dropped (and counted)
    min_query_chars: int = 3
    min_doc_chars: int = 10
    # batching: dynamic padding (each batch padded to its longest text), truncation at max_length
    batch_size: int = 32
    eval_batch_size: int = 128
    # hard negatives per query; rows with fewer get other rows' positives (random negatives)
    num_negatives: int = 0
    max_length: int = 256
    num_workers: int = 0
    pin_memory: FLAG = False
    persistent_workers: FLAG = False
    # training rows are tokenized once into a memory-mapped cache under <cache_dir>/tokenized/
    cache_dir: str | None = II("paths.cache_dir")
    # batches of similar-length texts (less padding, faster steps), drawn from shuffled windows of length_window
    # batches; the batch order stays shuffled. false gives uniformly random batches
    group_by_length: FLAG = True
    length_window: int = 50
    remine: Remine = field(default_factory=Remine)


@dataclass
class DemoData(DataCommon):
    """The offline demo corpus: summary line -> body of Python standard-library docstrings."""

    # cap on the corpus documents used as validation distractors (null: all)
    max_distractors: int | None = 1000
    val_fraction: float = 0.1
    min_query_chars: int = 10
    min_doc_chars: int = 40
    max_length: int = 128


@dataclass
class JsonlData(DataCommon):
    """Your own JSON-lines file(s)."""

    train_file: str = MISSING
    # null: hold out data.val_fraction of the training queries (a stable hash split)
    val_file: str | None = None


@dataclass
class HfColumns:
    """Which column holds each role."""

    query: str = "query"
    positive: str = "positive"
    negatives: str = "negatives"


@dataclass
class HfData(DataCommon):
    """A Hugging Face ``datasets`` dataset: hub name, local data folder (json/csv/parquet) or save_to_disk folder."""

    path: str = MISSING
    name: str | None = None
    train_split: str = "train"
    val_split: str | None = None
    columns: HfColumns = field(default_factory=HfColumns)


@dataclass
class BeirData(DataCommon):
    """A BEIR folder as training data: pairs from qrels/<train_split>.tsv (score > 0), validation on the first of
    val_splits that exists, over the whole corpus (none: val_fraction of the training queries is held out)."""

    path: str = MISSING
    train_split: str = "train"
    val_splits: list[str] = field(default_factory=lambda: ["dev", "test"])
    # cap on the corpus documents used as validation distractors (null: all)
    max_distractors: int | None = None


@dataclass
class MixData(DataCommon):
    """Several sources in one run (conf/data/mix.yaml says how they are drawn and validated)."""

    # name -> source: `type` (jsonl, hf, beir or demo) plus that type's own keys; checked per source
    sources: Any = MISSING
    # null: p_i proportional to n_i ** alpha. Or name -> weight (>= 0, not all zero), or a list in the sources' order
    weights: Any = None
    # 1: proportional to the sources' sizes, 0: uniform over sources, 0.5: the GTE paper's; >= 0
    alpha: float = 0.5
    # true: every global batch from one source, as in GTE; false: each row's source drawn on its own
    same_source_batches: FLAG = True


# --- model --------------------------------------------------------------------------------------------------------
@dataclass
class EncoderSchema:
    """Any BERT-like encoder from the Hugging Face hub or a local folder (conf/model/encoder.yaml and its presets)."""

    _target_: str = MISSING
    name_or_path: str = MISSING
    # mean | cls | last; null = read from the model's 1_Pooling/config.json (sentence-transformers), else mean
    pooling: str | None = None
    # L2-normalise embeddings; null = as the model's modules.json says (Normalize module), else true
    normalize: FLAG = None
    max_length: int = II("data.max_length")
    trust_remote_code: FLAG = False
    # sdpa | eager | flash_attention_2 | null (the model's default)
    attn_implementation: str | None = "sdpa"
    # recompute activations in backward (less memory, ~30% more compute); see also loss.mini_batch_size
    gradient_checkpointing: FLAG = False
    # run each forward pass in at most this many chunks of similar length, each padded only to its own longest text:
    # the same rows, batch and loss, less padding computed. 1 = one pass over the padded batch. auto: 4 on the CPU,
    # 1 on a GPU (small passes wait on kernel launches). Off with model.compile (recompiles)
    length_chunks: Any = "auto"
    # torch.compile the backbone (dynamic shapes); pays a compile time at start
    compile: FLAG = False
    # LoRA adapters (peft), e.g. {r: 16, alpha: 32, dropout: 0.1}; exports merge them into full weights and
    # <run>/adapter keeps the adapter alone. null: full fine-tuning
    lora: Any = None  # a dict or null (see the module docstring)
    # a head on top of pooling, before normalisation, e.g. {dims: [512, 512], activation: relu, dropout: 0.1};
    # exported as sentence-transformers Dense modules. activation: relu | gelu | tanh | identity. null: none
    projection: Any = None  # a dict or null (see the module docstring)
    # a dict of BertConfig fields: build a randomly initialised BERT with the named tokenizer (tests, debugging)
    random_init_config: Any = None  # a dict or null (see the module docstring)
    # prompts prepended to queries / documents (e5/bge style, e.g. "query: ")
    query_prefix: str = ""
    doc_prefix: str = ""
    # learning rate (read by optimizer/*); sweep it with `-m model.lr=1e-5,2e-5,5e-5`
    lr: float = 2e-5


# --- loss ---------------------------------------------------------------------------------------------------------
@dataclass
class InfoNCESchema:
    """InfoNCE / MultipleNegativesRanking (conf/loss/infonce.yaml); the GTE loss adds one key."""

    _target_: str = MISSING
    temperature: float = 0.05
    # under DDP: score against the documents of every rank (exact large-batch negatives)
    gather_across_devices: FLAG = True
    # cosine: score unit vectors, also for a model whose files carry no Normalize module; dot: score the embeddings
    # as the encoder returns them
    similarity: str = "cosine"
    # Matryoshka (as sentence-transformers' MatryoshkaLoss): the loss also on the first d dimensions of every
    # embedding, for each d, summed with matryoshka_weights (1 each unless set), e.g. [384, 256, 128, 64]. null: off
    matryoshka_dims: list[int] | None = None
    matryoshka_weights: list[float] | None = None
    # GradCache: embed the batch in chunks of this many texts without graphs, compute the loss on the whole batch,
    # then replay the chunks with gradients: the loss and gradients of one forward over data.batch_size in the
    # activation memory of mini_batch_size texts. strategy=fsdp is not supported. null: one forward over the batch
    mini_batch_size: int | None = None
    # non-finite guard: an optimizer step whose loss or gradient norm is NaN/inf is skipped (counted in
    # train/skipped_steps); the skip after this many stops the run, naming the step and the batch's rows. 0: stop
    # at the first one
    max_skipped_steps: int = 10


@dataclass
class GTESchema(InfoNCESchema):
    """GTE's improved contrastive loss: one partition function over q->d, q->q, d->q and d->d similarities."""

    temperature: float = 0.02
    # true: leave a document's own hard negatives out of its doc->doc terms (as sentence-transformers does)
    mask_own_negatives: FLAG = False


@dataclass
class MarginMSESchema(InfoNCESchema):
    """MarginMSE from teacher scores (conf/loss/margin_mse.yaml, gte_pro/training/losses_distill.py)."""

    # sentence-transformers' MarginMSELoss scores with the dot product (= cosine for a normalising encoder)
    similarity: str = "dot"
    # plus this times InfoNCE's in-batch term (temperature scales that term only); 0: the distillation term alone
    weight_infonce: float = 0.0


@dataclass
class DistillKLSchema(MarginMSESchema):
    """FlagEmbedding's KL distillation from teacher scores (conf/loss/distill_kl.yaml)."""

    temperature: float = 0.02  # the student's, in the distillation and the InfoNCE term
    similarity: str = "cosine"
    teacher_temperature: float = 1.0  # softmax(teacher scores / teacher_temperature)
    weight_infonce: float = 1.0  # FlagEmbedding adds its in-batch cross-entropy with weight 1


# --- evaluation and mining ----------------------------------------------------------------------------------------
@dataclass
class EvalSchema:
    """Retrieval sets in BEIR format, evaluated at every validation, at the end of training and by mode=eval."""

    # each entry: a folder (named after it, evaluated on `split`), or {path: folder, split: dev, name: scifact_dev}
    beir: Any = field(default_factory=list)
    split: str = "test"
    # texts per encoding batch (texts are sorted by length first, so batches carry little padding)
    batch_size: int | None = II("data.eval_batch_size")
    # truncation of queries and documents
    max_length: int | None = II("data.max_length")
    # also rank quantized embeddings (int8, binary) and report their NDCG@10 next to float32. []: float32 only
    quantization: list[str] = field(default_factory=list)
    # also evaluate the first d dimensions of the embeddings, for each d; by default loss.matryoshka_dims. null: none
    truncate_dims: list[int] | None = II("oc.select:loss.matryoshka_dims,null")
    # validate the untrained model before training too (val_before in metrics.json); false saves that pass
    before: FLAG = True


@dataclass
class MineSchema:
    """Hard-negative mining: ``mode=mine`` and ``data.remine`` (conf/mine/default.yaml says what it writes)."""

    # negatives mined per query (fewer where the window holds fewer survivors; training fills the rest at random)
    num_negatives: int = 15
    # rank window [range_min, range_max), 0-based among the non-positive corpus entries sorted by score: skipping
    # the top range_min avoids the unlabelled positives that usually sit there
    range_min: int = 10
    range_max: int = 100
    # top: the best survivors of the window (NV-Retriever's TopK-PercPos); random: a uniform draw among them
    sampling: str = "top"
    # drop a candidate scoring above (1 - relative_margin) x the query's positive score; null: off
    relative_margin: float | None = 0.05
    # drop a candidate scoring above the positive score minus absolute_margin; null: off
    absolute_margin: float | None = None
    # drop a candidate scoring above this cosine score; null: off
    max_score: float | None = None
    # extra documents to mine from: JSON-lines files of {"text": ...} or BEIR corpus.jsonl lines
    corpus_files: Any = field(default_factory=list)
    # texts per embedding batch, and their truncation
    batch_size: int = II("data.eval_batch_size")
    max_length: int = II("data.max_length")
    # the mined JSON-lines file; null: <run dir>/mined.jsonl
    output: str | None = None
    # bounds the (queries x corpus) block of scores held in memory at once (entries; 2^24 = 64 MB of float32)
    max_scores_per_chunk: int = 2**24


SCHEMAS: dict[str, dict[str, type]] = {
    "data": {"demo": DemoData, "jsonl": JsonlData, "hf": HfData, "beir": BeirData, "mix": MixData},
    "model": {"encoder": EncoderSchema},
    "loss": {"infonce": InfoNCESchema, "gte": GTESchema, "distill_kl": DistillKLSchema,
             "margin_mse": MarginMSESchema},
    "eval": {"default": EvalSchema},
    "mine": {"default": MineSchema},
}


def register_schemas() -> None:
    """Store every schema as ``schema/<group>/<option>`` (idempotent: the store replaces an entry of that name)."""
    store = ConfigStore.instance()
    for group, options in SCHEMAS.items():
        for option, schema in options.items():
            store.store(group=f"schema/{group}", name=option, node=schema)
