"""Re-mining during training (data.remine): the pool store, the dataset drawing from it, and whole runs that re-mine,
are stopped and resume."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch

from gte_pro.data.datasets import TokenizedPairs
from gte_pro.errors import DataError
from gte_pro.mining.pool import NegativePool, write_pool
from gte_pro.mining.remine import training_corpus
from gte_pro.train import train
from tests.test_resume import RUN, Crash, assert_same_run


def _refs(rows: int, k: int, shift: int) -> np.ndarray:
    """Row r's negatives: the first positives of rows r+shift, r+2*shift, ... (mod rows); the last one missing."""
    refs = np.full((rows, k, 2), -1, dtype=np.int32)
    for r in range(rows):
        for i in range(k - 1):
            refs[r, i] = ((r + (i + 1) * shift) % rows, 0)
    return refs


def test_the_active_pool_is_the_latest_one_up_to_the_epoch(tmp_path: Path):
    pool = NegativePool(tmp_path / "negatives", negatives_per_row=2)
    assert pool.references([0, 1], epoch=0) is None  # no pool yet: the rows' own negatives
    write_pool(pool.folder, 1, _refs(6, 3, 1), {"dim": 8})
    write_pool(pool.folder, 3, _refs(6, 3, 2), {"dim": 8})
    pool.refresh()
    assert [pool.active_epoch(e) for e in range(5)] == [None, 1, 1, 3, 3]
    assert pool.references([0, 5], epoch=2) == [[(1, 0), (2, 0)], [(0, 0), (1, 0)]]
    assert pool.references([0], epoch=4) == [[(2, 0), (4, 0)]]
    # a pool without its metadata (killed between the two writes) does not count
    (pool.folder / "epoch-0003.json").unlink()
    pool.refresh()
    assert pool.epochs() == [1] and pool.active_epoch(4) == 1
    write_pool(pool.folder, 3, _refs(6, 3, 2), {"dim": 8})
    assert pool.discard_after(1) == [3] and pool.epochs() == [1]
    assert not list(pool.folder.glob("epoch-0003*"))


def test_a_pool_from_other_data_or_another_model_is_refused_naming_its_file(tmp_path: Path):
    pool = NegativePool(tmp_path, negatives_per_row=2)
    write_pool(tmp_path, 1, _refs(6, 3, 1), {"dim": 8})
    pool.check(num_rows=6, dim=8)
    with pytest.raises(DataError, match=r"epoch-0001\.json: a negative pool for 6 training rows.* has 7"):
        pool.check(num_rows=7, dim=8)
    with pytest.raises(DataError, match=r"epoch-0001\.json: .* 8-dimensional embeddings, but the model's are 16"):
        pool.check(num_rows=6, dim=16)


def _token_rows(n: int = 6) -> datasets.Dataset:
    return datasets.Dataset.from_dict({
        "query": [[100 + r] for r in range(n)],
        "positives": [[[200 + r, 1], [300 + r]] for r in range(n)],
        "negatives": [[[400 + r], [500 + r]] for r in range(n)],
    })


def test_the_dataset_draws_negatives_from_the_pool_of_the_items_epoch(tmp_path: Path):
    pool = NegativePool(tmp_path, negatives_per_row=2)
    write_pool(tmp_path, 1, _refs(6, 3, 1), {"dim": 8})
    pairs = TokenizedPairs(_token_rows(), num_negatives=2, seed=0, mined=pool)
    before = pairs.__getitems__([(0, 0), (3, 0)])
    assert all(sorted(n[0] for n in item.negatives) == [400 + item.row, 500 + item.row] for item in before)
    after = pairs.__getitems__([(0, 1), (3, 1)])
    # the pool's references, resolved to the referenced rows' positives' token ids
    assert sorted(map(tuple, after[0].negatives)) == [(201, 1), (202, 1)]
    assert sorted(map(tuple, after[1].negatives)) == [(204, 1), (205, 1)]
    # the same draw again, and in a copy (as a DataLoader worker gets it)
    import pickle

    copy = pickle.loads(pickle.dumps(pairs))
    assert copy.__getitems__([(0, 1), (3, 1)]) == after == pairs.__getitems__([(0, 1), (3, 1)])


def test_the_training_corpus_holds_each_text_once_and_maps_rows_to_their_positives():
    table = datasets.Dataset.from_dict({
        "query_text": ["q0", "q1", "q2"],
        "positive_texts": [["doc a", "doc b"], ["doc c"], ["doc a"]],
    })
    queries, corpus, refs, positives = training_corpus(table)
    assert queries == ["q0", "q1", "q2"]
    assert corpus == ["doc a", "doc b", "doc c"]
    assert refs.tolist() == [[0, 0], [0, 1], [1, 0]]
    assert positives == [[0, 1], [2], [0]]  # row 2's positive is row 0's first: the same corpus id, never a negative


REMINE = [*RUN, "data.num_negatives=2", "data.remine.every_n_epochs=1", "data.remine.at_start=true",
          "mine.range_min=0", "mine.range_max=16", "mine.num_negatives=4", "mine.relative_margin=null"]


def _pools(run: Path) -> dict[str, np.ndarray]:
    return {p.name: np.load(p) for p in sorted((run / "negatives").glob("*.npy"))}


@pytest.mark.slow  # three 2-epoch runs with two re-mines each (~1.5 min on 2 idle cores)
def test_a_run_re_mines_every_epoch_and_a_resumed_one_continues_with_the_same_pool(make_cfg, tmp_path: Path):
    """Pools at the start of epochs 0 and 1 (the second from trained weights: it differs); a run stopped in epoch 1
    and started again ends with the same weights bit for bit and the same pools, and the cost is recorded."""
    reference = tmp_path / "reference"
    train(make_cfg(REMINE, output_dir=reference))
    pools = _pools(reference)
    assert list(pools) == ["epoch-0000.npy", "epoch-0001.npy"]
    assert pools["epoch-0000.npy"].shape[1:] == (4, 2) and not np.array_equal(*pools.values())
    summary = json.loads((reference / "metrics.json").read_text())
    assert [cost["epoch"] for cost in summary["remine"]] == [0, 1]
    assert all(cost["seconds"] > 0 for cost in summary["remine"])
    assert summary["remine"][1]["epoch_seconds"] > 0

    stopped = tmp_path / "stopped"
    with pytest.raises(Crash):
        train(make_cfg([*REMINE, "+callbacks.crash._target_=tests.test_resume.CrashAt", "+callbacks.crash.step=15"],
                       output_dir=stopped))
    assert torch.load(stopped / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 14
    train(make_cfg(REMINE, output_dir=stopped))
    assert_same_run(stopped, reference)
    resumed = _pools(stopped)
    assert resumed.keys() == pools.keys() and all(np.array_equal(resumed[k], pools[k]) for k in pools)


def test_remining_without_negatives_to_draw_is_an_error(make_cfg, tmp_path: Path):
    with pytest.raises(ValueError, match=r"data\.remine needs hard negatives.*data\.num_negatives > 0"):
        train(make_cfg([*RUN, "data.num_negatives=0", "data.remine.every_n_epochs=1"]))
