"""data.decontaminate: planted exact and near duplicates of every evaluation set of a run (data.val_file, the
held-out split, eval.beir) are all found, per field, distinct texts are not, and drop removes exactly them."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from gte_pro.data.base import ContrastiveDataModule
from gte_pro.data.beir import relevant_texts
from gte_pro.data.decontamination import REPORT
from gte_pro.data.overlap_matching import EvalIndex, normalise, shingle_sets
from gte_pro.data.split import is_held_out
from gte_pro.errors import ConfigError
from gte_pro.evaluation.sets import BeirEvalSets
from gte_pro.modes.build_data import data_module
from tests.beir_data import write_beir_folder
from tests.conftest import write_jsonl

WORDS = [f"{a}{b}" for a in ("ka", "lo", "mi", "ren", "tu", "vor", "sa", "el") for b in
         ("bin", "dor", "fex", "gul", "hap", "jin", "kol", "mur", "nix", "pel", "quo", "rit")]


def sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def changed(text: str, positions: tuple[int, ...]) -> str:
    """``text`` with the words at ``positions`` replaced: a near duplicate."""
    words = text.split()
    for i in positions:
        words[i] = "zzplanted"
    return " ".join(words)


def named_sets(folder: Path) -> BeirEvalSets:
    """eval.beir=[{path: folder, name: tiny}] as the run hands it to the data module."""
    return BeirEvalSets(OmegaConf.create({"eval": {"beir": [{"path": str(folder), "name": "tiny"}], "split": "test"}}))


def planted_files(tmp_path: Path) -> tuple[Path, Path, Path, dict[str, str]]:
    """A BEIR folder, a val file, and a training file of 80 distinct rows plus rows that repeat each set; returns
    (train, val, beir, {planted query: what it repeats})."""
    rng = random.Random(0)
    beir = write_beir_folder(tmp_path / "beir")
    beir_queries, beir_docs = relevant_texts(beir, "test")
    val = [{"query": sentence(rng, 8), "positive": sentence(rng, 60)} for _ in range(5)]
    write_jsonl(tmp_path / "val.jsonl", val)
    rows = [{"query": sentence(rng, 8), "positive": sentence(rng, 50), "negatives": [sentence(rng, 50)]}
            for _ in range(80)]
    planted = {
        # exact after normalisation: case, whitespace and punctuation changed
        "  " + beir_queries[0].upper() + " ?!": "beir query exact",
        "p1 " + sentence(rng, 6): "beir positive near",  # the document with one word more
        "p2 " + sentence(rng, 6): "val positive exact",
        val[1]["query"].replace(" ", "  ").title() + ".": "val query exact",
        "p3 " + sentence(rng, 6): "val negative near",  # two words changed of 60
    }
    queries = list(planted)
    extra = [
        {"query": queries[0], "positive": sentence(rng, 50)},
        {"query": queries[1], "positive": beir_docs[1] + " indeed"},
        {"query": queries[2], "positive": "«" + val[2]["positive"].upper() + "»"},
        {"query": queries[3], "positive": sentence(rng, 50)},
        {"query": queries[4], "positive": sentence(rng, 50), "negatives": [changed(val[3]["positive"], (10, 40))]},
    ]
    write_jsonl(tmp_path / "train.jsonl", rows[:40] + extra + rows[40:])
    return tmp_path / "train.jsonl", tmp_path / "val.jsonl", beir, planted


def module(tokenizer: Any, train: Path, tmp_path: Path, **options: Any) -> ContrastiveDataModule:
    data = data_module("jsonl", train_file=str(train), tokenizer=tokenizer, cache_dir=str(tmp_path / "cache"),
                       batch_size=4, **options)
    data.prepare_data()
    data.setup("fit")
    return data


def test_normalisation_makes_case_space_and_punctuation_changes_exact_duplicates():
    assert normalise("  Héllo,\tWORLD!!  (again) ") == normalise("héllo world again") == "héllo world again"
    assert normalise("ﬁve ＡＢＣ") == "five abc"  # NFKC
    first, same, other = shingle_sets([normalise("The cat sat on the mat."), "the cat sat on the mat", "a b c"])
    assert first.tolist() == same.tolist() and len(first) == 4 and not set(first) & set(other)


def test_the_index_finds_near_duplicates_at_the_threshold_and_not_below():
    rng = random.Random(1)
    docs = [sentence(rng, 40) for _ in range(50)]
    index = EvalIndex([("set", doc) for doc in docs], threshold=0.8, num_perm=128)
    near = changed(docs[7], (20,))  # 38 word 3-grams, 3 replaced: Jaccard 35/41 = 0.854
    far = changed(docs[8], (5, 15, 25, 35))  # 12 of 38 replaced: below 0.8
    found = index.match([near, far, docs[9].upper(), sentence(rng, 40)])
    assert [(m.kind, m.text) for m in found[0]] == [("near", docs[7])] and found[0][0].jaccard == pytest.approx(35 / 41,
                                                                                                                abs=1e-3)
    assert found[1] == [] and found[3] == []
    assert [(m.kind, m.text) for m in found[2]] == [("exact", docs[9])]


def test_planted_duplicates_of_the_val_file_and_beir_are_all_found_and_dropped(tokenizer, tmp_path: Path):
    train, val, beir, planted = planted_files(tmp_path)
    report_run = module(tokenizer, train, tmp_path, val_file=str(val), eval_sets=named_sets(beir))
    report = report_run.decontamination
    assert report["mode"] == "report" and report["training_rows"] == 85 and len(report_run.train_rows) == 85
    assert report["overlapping_rows"] == 5 and report["rows_by_field"] == {"query": 2, "positive": 2, "negative": 1}
    counts = {name: {(field, kind): n for field, kinds in entry["overlap"].items() for kind, n in kinds.items() if n}
              for name, entry in report["sets"].items()}
    assert counts == {"held-out": {("query", "exact"): 1, ("positive", "exact"): 1, ("negative", "near"): 1},
                      "tiny": {("query", "exact"): 1, ("positive", "near"): 1}}
    assert report["sets"]["tiny"]["queries"] == 8 and report["sets"]["held-out"]["queries"] == 5
    examples = [e for entry in report["sets"].values() for e in entry["examples"]]
    assert {e["row"] for e in examples} == {40, 41, 42, 43, 44}
    assert all(0.8 <= e["jaccard"] < 1 for e in examples if e["kind"] == "near")

    dropped = module(tokenizer, train, tmp_path, val_file=str(val), eval_sets=named_sets(beir), decontaminate="drop")
    assert dropped.decontamination["dropped_rows"] == 5 and len(dropped.train_rows) == 80
    assert not {ex.query for ex in dropped.train_rows} & set(planted)
    assert dropped.token_cache.folder.name.startswith(report_run.token_cache.folder.name + "-")
    assert dropped.token_cache.folder.parent == tmp_path / "cache" / "decontaminated"
    assert (dropped.token_cache.folder / REPORT).is_file()
    off = module(tokenizer, train, tmp_path, val_file=str(val), decontaminate="off")
    assert off.decontamination is None and off.token_cache.folder == report_run.token_cache.folder


def test_rows_repeating_the_held_out_split_are_found(tokenizer, tmp_path: Path):
    rng = random.Random(2)
    rows = [{"query": f"{sentence(rng, 6)} {i}", "positive": sentence(rng, 50)} for i in range(200)]
    held = next(row for row in rows if is_held_out(row["query"], 0.1))
    variant = next(v for v in (held["query"].upper() + suffix for suffix in ("?", "!", " .", "..", ";"))
                   if not is_held_out(v, 0.1))  # the same query after normalisation, in the training buckets
    rows.append({"query": variant, "positive": changed(held["positive"], (25,))})
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    data = module(tokenizer, train, tmp_path, val_fraction=0.1, decontaminate="drop")
    report = data.decontamination
    overlap = report["sets"]["held-out"]["overlap"]
    assert overlap["query"] == {"exact": 1, "near": 0} and overlap["positive"] == {"exact": 0, "near": 1}
    assert report["overlapping_rows"] == report["dropped_rows"] == 1
    assert variant not in {ex.query for ex in data.train_rows}


def test_a_wrong_mode_names_the_key_and_its_choices(make_cfg, tmp_path: Path):
    from gte_pro.config.checks import check_config

    cfg = make_cfg(["data.decontaminate=remove"])
    with pytest.raises(ConfigError, match=r"data\.decontaminate.*report, drop, off"):
        check_config(cfg)


def test_a_composed_run_reports_the_overlap(make_cfg, tokenizer, tmp_path: Path, caplog):
    from gte_pro.evaluation.sets import eval_set_source
    from gte_pro.modes.build_data import build_datamodule

    train, val, beir, _ = planted_files(tmp_path)
    cfg = make_cfg(["data=jsonl", f"data.train_file={train}", f"data.val_file={val}", f"eval.beir=[{beir}]",
                    "data.batch_size=4"])
    data = build_datamodule(cfg, tokenizer, eval_sets=eval_set_source(cfg))
    with caplog.at_level("INFO", logger="gte_pro.data.decontamination"):
        data.prepare_data()
        data.setup("fit")
    assert data.decontamination["overlapping_rows"] == 5
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("decontamination:")]
    assert any("beir: " in line or "beir (" in line for line in lines), lines
    assert lines[-1].startswith("decontamination: 5 of 85 training rows overlap an evaluation set")
    assert json.loads(json.dumps(data.decontamination)) == data.decontamination


@pytest.mark.slow  # a whole training run: 16-23 s on 2 shared cores
def test_a_training_run_drops_the_rows_and_records_the_report(make_cfg, tmp_path: Path):
    from gte_pro.train import train

    train_file, val, beir, planted = planted_files(tmp_path)
    cfg = make_cfg(["debug=fast", "logger=none", "data=jsonl", f"data.train_file={train_file}",
                    f"data.val_file={val}", f"eval.beir=[{{path: {beir}, name: tiny}}]", "data.decontaminate=drop",
                    "data.max_train_rows=null", "trainer.limit_train_batches=2"], output_dir=tmp_path / "run")
    train(cfg)
    report = json.loads((tmp_path / "run" / REPORT).read_text())
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert report["dropped_rows"] == 5 and report["training_rows"] == 85 and metrics["decontamination"] == report
    assert set(report["sets"]) == {"held-out", "tiny"} and metrics["global_step"] == 2


def test_a_resume_may_switch_report_and_off_but_not_what_drop_trains_on(make_cfg, tmp_path: Path):
    from gte_pro.launch.resume import check_resumed_config

    run, beir = tmp_path / "run", write_beir_folder(tmp_path / "beir")
    ckpt = str(run / "checkpoints" / "last.ckpt")
    check_resumed_config(make_cfg(["debug=fast"], output_dir=run), run, None)
    # report and off train the same rows (and a run recorded before the key existed resumes as it did)
    assert check_resumed_config(make_cfg(["debug=fast", "data.decontaminate=off"], output_dir=run), run, ckpt) == {}
    with pytest.raises(ValueError, match=r"data\.decontaminate: None -> 'drop'"):
        check_resumed_config(make_cfg(["debug=fast", "data.decontaminate=drop"], output_dir=run), run, ckpt)
    dropped = tmp_path / "dropped"
    check_resumed_config(make_cfg(["debug=fast", "data.decontaminate=drop"], output_dir=dropped), dropped, None)
    # with drop, eval.beir decides which rows train: another set is another training
    with pytest.raises(ValueError, match=r"eval\.beir: \[\] -> \[."):
        check_resumed_config(make_cfg(["debug=fast", "data.decontaminate=drop", f"eval.beir=[{beir}]"],
                                      output_dir=dropped), dropped, ckpt)


def test_a_mix_drops_each_sources_rows_that_repeat_eval_beir(tokenizer, tmp_path: Path):

    train, _, beir, planted = planted_files(tmp_path)  # 2 rows repeat the BEIR set, 3 the val file (not a mix's)
    other = write_jsonl(tmp_path / "other.jsonl", [{"query": f"another question {i} about {WORDS[i]}",
                                                    "positive": f"another answer {i} " + WORDS[i] * 3}
                                                   for i in range(40)])
    sources = {"a": {"type": "jsonl", "train_file": str(train)}, "b": {"type": "jsonl", "train_file": str(other)}}
    mix = data_module("mix", sources=sources, tokenizer=tokenizer, batch_size=4, val_fraction=0.1, seed=7,
                      cache_dir=str(tmp_path / "cache"), eval_sets=named_sets(beir), decontaminate="drop")
    mix.prepare_data()
    mix.setup("fit")
    reports = mix.decontamination["sources"]
    # the rows repeating BEIR that the 10% split left in training (a held-out one is validation, not training)
    trained = [is_held_out(query, 0.1) is False for query in list(planted)[:2]]
    counts = reports["a"]["sets"]["tiny"]["overlap"]
    assert [counts["query"], counts["positive"]] == [{"exact": int(trained[0]), "near": 0},
                                                     {"exact": 0, "near": int(trained[1])}] and any(trained)
    assert reports["b"]["overlapping_rows"] == 0 and mix.sources["b"].decontamination["dropped_rows"] == 0
    kept = {ex.query for ex in mix.sources["a"].train_rows}
    assert not kept & set(list(planted)[:2]) and reports["a"]["dropped_rows"] == reports["a"]["overlapping_rows"]
