"""model.length_chunks: the DP is optimal, and a chunked pass equals one padded pass (values and gradients)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from gte_pro import packaged_minilm_path
from gte_pro.models.encoder import Encoder
from gte_pro.models.length_chunks import chunk_plan, padded_positions

TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
        "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


def _brute_force(lengths: list[int], max_chunks: int) -> int:
    """Fewest padded positions over every way to cut the longest-first order into at most max_chunks groups."""
    ordered, rows = sorted(lengths, reverse=True), len(lengths)
    costs = []
    for chunks in range(1, max_chunks + 1):
        for cuts in itertools.combinations(range(1, rows), chunks - 1):
            bounds = [0, *cuts, rows]
            costs.append(sum((bounds[t + 1] - bounds[t]) * ordered[bounds[t]] for t in range(chunks)))
    return min(costs)


def test_the_plan_covers_every_row_once_and_pads_the_fewest_positions():
    rng = np.random.default_rng(0)
    for _ in range(300):
        lengths = rng.integers(1, 20, size=int(rng.integers(1, 9)))
        max_chunks = int(rng.integers(1, 4))
        plan = chunk_plan(lengths, max_chunks)
        assert sorted(np.concatenate([rows for rows, _ in plan]).tolist()) == list(range(len(lengths)))
        assert len(plan) <= max_chunks and all(lengths[rows].max() == width for rows, width in plan)
        assert padded_positions(lengths, max_chunks) == _brute_force(lengths.tolist(), max_chunks)
    assert [(rows.tolist(), width) for rows, width in chunk_plan([5, 5, 5], 4)] == [([0, 1, 2], 5)]
    assert padded_positions([3, 10, 4, 4], 1) == 40 and padded_positions([3, 10, 4, 4], 2) == 10 + 3 * 4
    assert padded_positions([3, 4], 1, width=16) == 32  # one pass computes the padded tensor's width


def test_the_plan_is_bounded_by_distinct_lengths_not_rows():
    lengths = np.random.default_rng(1).integers(1, 129, size=20_000)
    plan = chunk_plan(lengths, 4)
    assert len(plan) == 4 and sum(len(rows) for rows, _ in plan) == 20_000


@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
def test_a_chunked_pass_equals_one_padded_pass(pooling: str):
    torch.manual_seed(0)
    chunked = Encoder.load(packaged_minilm_path(), random_init_config=TINY, pooling=pooling, length_chunks=3).double()
    single = Encoder.load(packaged_minilm_path(), random_init_config=TINY, pooling=pooling, length_chunks=1).double()
    single.load_state_dict(chunked.state_dict())
    texts = ["a", "a much longer text about tokenizers and padding, " * 3, "b c", "the middle one is here",
             "x y", "another long one that sets the width of the padded batch " * 2]
    features = chunked.tokenize(texts)
    assert chunked._chunk_plan(features["attention_mask"]) is not None  # it really splits this batch
    outputs = [encoder(**features) for encoder in (chunked, single)]
    torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-10, atol=1e-10)
    weights = torch.randn_like(outputs[0])
    for out in outputs:
        (out * weights).sum().backward()
    for (name, a), b in zip(chunked.named_parameters(), single.parameters(), strict=True):
        if a.grad is not None or b.grad is not None:
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-9, atol=1e-10, msg=name)


def test_length_chunks_is_off_under_compile_and_refuses_zero():
    cpu = torch.device("cpu")
    compiled = Encoder.load(packaged_minilm_path(), random_init_config=TINY, length_chunks=4, compile=True)
    assert compiled.chunks_on(cpu) == 1
    with pytest.raises(ValueError, match="model.length_chunks=0"):
        Encoder.load(packaged_minilm_path(), random_init_config=TINY, length_chunks=0)


def test_auto_chunks_on_the_cpu_and_runs_one_pass_elsewhere():
    encoder = Encoder.load(packaged_minilm_path(), random_init_config=TINY, length_chunks="auto")
    assert encoder.chunks_on(torch.device("cpu")) == 4
    assert encoder.chunks_on(torch.device("cuda")) == 1 and encoder.chunks_on(torch.device("meta")) == 1
    three = Encoder.load(packaged_minilm_path(), random_init_config=TINY, length_chunks=3)
    assert three.chunks_on(torch.device("cuda")) == 3
    for bad in ("4", 2.0, True, "off"):
        with pytest.raises(ValueError, match="valid: auto, 1"):
            Encoder.load(packaged_minilm_path(), random_init_config=TINY, length_chunks=bad)


def test_the_config_check_names_length_chunks_choices(make_cfg):
    from gte_pro.config.checks import check_config
    from gte_pro.errors import ConfigError

    check_config(make_cfg(["model.length_chunks=auto"]))
    check_config(make_cfg(["model.length_chunks=2"]))
    with pytest.raises(ConfigError, match=r"model.length_chunks=0: expected auto or an integer >= 1"):
        check_config(make_cfg(["model.length_chunks=0"]))

