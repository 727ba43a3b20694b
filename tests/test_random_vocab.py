"""``model.random_init_config.vocab_size``: a random model may have a real model's larger embedding matrix (Qwen2's
151,936 rows, most of a small decoder's weights) over a small offline tokenizer; never fewer rows than tokens."""

from __future__ import annotations

import pytest

from gte_pro.errors import ConfigError
from gte_pro.models.loading import random_config
from gte_pro.models.tiny_tokenizer import tiny_bpe_tokenizer

QWEN2 = {"model_type": "qwen2", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
         "num_key_value_heads": 2, "intermediate_size": 64}


@pytest.fixture(scope="module")
def bpe(tmp_path_factory: pytest.TempPathFactory):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_bpe_tokenizer(tmp_path_factory.mktemp("bpe")))


def test_without_vocab_size_the_tokenizer_sets_it(bpe):
    assert random_config(bpe, QWEN2).vocab_size == len(bpe)


def test_a_larger_vocab_size_is_kept_and_the_embedding_matrix_has_its_rows(bpe):
    from transformers import AutoModel

    config = random_config(bpe, {**QWEN2, "vocab_size": 151_936})
    assert config.vocab_size == 151_936 and config.eos_token_id == bpe.eos_token_id
    assert AutoModel.from_config(config).get_input_embeddings().weight.shape == (151_936, 32)


def test_a_vocab_size_below_the_tokenizer_is_refused(bpe):
    with pytest.raises(ConfigError, match=f"vocab_size=10 is smaller than the tokenizer's {len(bpe)} tokens"):
        random_config(bpe, {**QWEN2, "vocab_size": 10})
