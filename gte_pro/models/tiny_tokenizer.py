"""A byte-level BPE tokenizer built offline, for randomly initialised decoder models in tests and debug runs
(``conf/model/tiny_qwen2.yaml``: ``${tiny_bpe_tokenizer:}``).

transformers loads a decoder checkpoint's tokenizer by its architecture (a ``qwen2`` folder gets a
``Qwen2Tokenizer``, whatever ``tokenizer_config.json`` says), so a tiny Qwen2 cannot borrow MiniLM's WordPiece and
still round-trip through its exports. Byte-level BPE encodes any text (its alphabet is the 256 bytes), so a few
hundred merges learnt from a paragraph are enough; the tokenizer is written once into the cache and reused
(``shared_folder``: processes that need it at once build it once; a damaged one is rebuilt).
"""

from __future__ import annotations

from pathlib import Path

from gte_pro.utils.cache import cache_root
from gte_pro.utils.files import published_folder
from gte_pro.utils.shared_cache import shared_folder

EOS = "<|endoftext|>"
VOCAB_SIZE = 1024
_TEXT = (
    "How do I sort a list in Python? sorted(iterable) returns a new sorted list; list.sort() sorts in place. "
    "Open a file with open(path) and read it with read(); the with statement closes it. A dictionary maps keys "
    "to values: d[key] = value, d.get(key, default), d.items(). Retrieve the passages that answer the question. "
    "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery: "
    "The quick brown fox jumps over the lazy dog. 0123456789 the of and to in is that for it as with was on be "
)


def tiny_bpe_tokenizer(cache_dir: str | Path | None = None) -> str:
    """The folder of the tiny tokenizer (``EOS`` is its end-of-sequence and padding token), built if missing."""
    folder = cache_root(cache_dir) / "models" / f"tiny-bpe-{VOCAB_SIZE}"
    return str(shared_folder(folder, _publish, "tiny tokenizer", marker="tokenizer.json"))


def _publish(folder: Path) -> None:
    with published_folder(folder, marker="tokenizer.json") as tmp:
        _build(tmp)


def _build(folder: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator([_TEXT] * 4, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=EOS, pad_token=EOS,
                                        model_max_length=8192)
    tokenizer.save_pretrained(str(folder))
