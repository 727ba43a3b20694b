"""The data group: the keys every source shares, and each source's own."""

from dataclasses import dataclass
from typing import Any

from omegaconf import II, MISSING

from gte_pro.config.rules import FLAG as IS_FLAG
from gte_pro.config.rules import choice, integer, number, text
from gte_pro.config.schema.types import FLAG, redefault, setting


@dataclass
class Remine:
    """Re-mining during training: at the start of every ``every_n_epochs``-th epoch (0: off; and of the first epoch
    with ``at_start``) the training queries and corpus (every row's positives) are embedded with the current weights
    and each row's hard negatives are mined afresh with the ``mine.*`` options (rank window, margins, sampling);
    needs ``data.num_negatives != 0`` (null: mine.num_negatives or more). The pools are kept in
    ``<run dir>/negatives/``; the log and metrics.json say what each re-mine cost against its epoch."""

    every_n_epochs: int = setting(0, "re-mine the hard negatives at the start of every N-th epoch; 0: off",
                                  integer(0))
    at_start: FLAG = setting(False, "also re-mine before the first epoch", IS_FLAG)


@dataclass
class DataCommon:
    """The keys every data source shares; ``conf/data/<option>.yaml`` extends its subclass below."""

    _target_: str = MISSING
    val_fraction: float = setting(
        0.05, "held-out validation: a stable hash of the query picks this fraction of the training queries (sources "
        "with their own validation file or split use that instead)", number(0, 1, open_high=True))
    max_val_queries: int | None = setting(1000, "at most this many validation queries are scored (null: all)",
                                          integer(1, optional=True))
    val_distractors: int | None = setting(
        10000, "the held-out queries are searched over the held-out documents plus at most this many distinct "
        "documents of the training rows (positives and negatives, a fixed sample), so that validation can tell "
        "recipes apart; null: every document; 0: the held-out documents only", integer(0, optional=True))
    max_train_rows: int | None = setting(None, "cap on the training rows read (null: all)", integer(1, optional=True))
    min_query_chars: int = setting(3, "rows whose query is shorter than this are dropped (and counted)", integer(0))
    min_doc_chars: int = setting(10, "positives shorter than this are dropped; a row left without one is dropped",
                                 integer(0))
    batch_size: int = setting(32, "training rows per batch and device (dynamic padding: each batch is padded to its "
                              "longest text)", integer(2))
    eval_batch_size: int = setting(128, "texts per encoding batch at validation", integer(1))
    num_negatives: int | None = setting(None, "hard negatives per query; null: as many as the rows carry (the most "
                                        "of any row); rows with fewer get other rows' positives (random negatives); "
                                        "0: in-batch negatives only", integer(0, optional=True))
    max_length: int = setting(256, "truncation of every text (tokens)", integer(1))
    num_workers: int = setting(0, "DataLoader worker processes", integer(0))
    pin_memory: FLAG = setting(False, "DataLoader pin_memory", IS_FLAG)
    persistent_workers: FLAG = setting(False, "DataLoader persistent_workers", IS_FLAG)
    cache_dir: str | None = setting(II("paths.cache_dir"), "training rows are tokenized once into a memory-mapped "
                                    "cache under <cache_dir>/tokenized/")
    group_by_length: FLAG = setting(True, "batches of similar-length texts (less padding), drawn from shuffled "
                                    "windows of length_window batches; false: uniformly random batches", IS_FLAG)
    length_window: int = setting(50, "batches per window of group_by_length", integer(1))
    remine: Remine = setting(Remine(), "re-mining during training (see data.remine.*)")
    decontaminate: str = setting("report", "overlap of the training rows with every evaluation set of the run "
                                 "(held-out split or val file, eval.beir): report it, drop the rows, or off",
                                 choice("report", "drop", "off"))
    decontaminate_threshold: float = setting(0.8, "near duplicates: Jaccard of the word 3-grams of the normalised "
                                             "texts at least this", number(0, 1, open_low=True))
    decontaminate_num_perm: int = setting(128, "MinHash permutations of the near-duplicate search", integer(16))


@dataclass
class DemoData(DataCommon):
    """The offline demo corpus: summary line -> body of Python standard-library docstrings."""

    _target_: str = "gte_pro.data.demo.DemoRows"
    max_distractors: int | None = setting(1000, "cap on the corpus documents used as validation distractors "
                                          "(null: all)", integer(0, optional=True))
    val_fraction: float = redefault(DataCommon, "val_fraction", 0.1)
    min_query_chars: int = redefault(DataCommon, "min_query_chars", 10)
    min_doc_chars: int = redefault(DataCommon, "min_doc_chars", 40)
    max_length: int = redefault(DataCommon, "max_length", 128)


@dataclass
class JsonlData(DataCommon):
    """Your own JSON-lines file(s)."""

    _target_: str = "gte_pro.data.jsonl.JsonlRows"
    train_file: str = setting(MISSING, "the training file: one {query, positive(s)[, negatives]} object a line")
    val_file: str | None = setting(None, "a validation file of the same layout; null: hold out data.val_fraction "
                                   "of the training queries", text(optional=True))


@dataclass
class HfColumns:
    """Which column holds each role."""

    query: str = setting("query", "the query column")
    positive: str = setting("positive", "the positive column (a text or a list of texts)")
    negatives: str = setting("negatives", "the hard negatives column (a list of texts)")


@dataclass
class HfData(DataCommon):
    """A Hugging Face ``datasets`` dataset: hub name, local data folder (json/csv/parquet) or save_to_disk folder."""

    _target_: str = "gte_pro.data.hf.HfRows"
    path: str = setting(MISSING, "hub name, local data folder (json/csv/parquet) or save_to_disk folder")
    name: str | None = setting(None, "the dataset's configuration name")
    train_split: str = setting("train", "the training split")
    val_split: str | None = setting(None, "the validation split; null: hold out data.val_fraction")
    columns: HfColumns = setting(HfColumns(), "which column holds each role (data.columns.query/positive/negatives)")


@dataclass
class BeirData(DataCommon):
    """A BEIR folder as training data: pairs from qrels/<train_split>.tsv (score > 0), validation on the first of
    val_splits that exists, over the whole corpus (none: val_fraction of the training queries is held out)."""

    _target_: str = "gte_pro.data.beir_rows.BeirRows"
    path: str = setting(MISSING, "the BEIR folder (corpus.jsonl, queries.jsonl, qrels/)")
    train_split: str = setting("train", "the qrels file of the training pairs (score > 0)")
    val_splits: list[str] = setting(["dev", "test"], "validation on the first of these qrels files that exists")
    max_distractors: int | None = setting(None, "cap on the corpus documents used as validation distractors "
                                          "(null: all)", integer(0, optional=True))


@dataclass
class MixData(DataCommon):
    """Several sources in one run (conf/data/mix.yaml says how they are drawn and validated)."""

    _target_: str = "gte_pro.data.mix.Mixing"
    sources: Any = setting(MISSING, "name -> source: `type` (jsonl, hf, beir or demo) plus that type's own keys; "
                           "checked per source")
    weights: Any = setting(None, "null: p_i proportional to n_i ** alpha; or name -> weight (>= 0, not all zero), "
                           "or a list in the sources' order")
    alpha: float = setting(0.5, "1: proportional to the sources' sizes, 0: uniform over sources, 0.5: the GTE "
                           "paper's", number(0))
    same_source_batches: FLAG = setting(True, "true: every global batch from one source, as in GTE; false: each "
                                        "row's source drawn on its own", IS_FLAG)
