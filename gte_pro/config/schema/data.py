"""The data group: the keys every source shares, and each source's own."""

from dataclasses import dataclass, field
from typing import Any

from omegaconf import II, MISSING

from gte_pro.config.schema.types import FLAG


@dataclass
class Remine:
    """Re-mining during training: at the start of every ``every_n_epochs``-th epoch (0: off; and of the first epoch
    with ``at_start``) the training queries and corpus (every row's positives) are embedded with the current weights
    and each row's hard negatives are mined afresh with the ``mine.*`` options (rank window, margins, sampling);
    needs ``data.num_negatives != 0`` (null: mine.num_negatives or more). The pools are kept in
    ``<run dir>/negatives/``; the log and metrics.json say what each re-mine cost against its epoch."""

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
    # hard negatives per query (null: as many as the rows carry, the most of any row); rows with fewer get other
    # rows' positives (random negatives). 0: in-batch negatives only
    num_negatives: int | None = None
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
