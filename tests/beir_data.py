"""A small BEIR folder written by the tests: 36 documents about distinct topics, train/dev/test qrels."""

from __future__ import annotations

import json
from pathlib import Path

# (title, text, query): each query is about its own document; the other documents compete with it
TOPICS = [
    ("Honey bees", "Honey bees communicate the direction of flowers to the hive with a waggle dance.",
     "how do bees tell each other where flowers are"),
    ("Octopus", "An octopus has three hearts and blue blood that carries oxygen with copper.",
     "why is octopus blood blue"),
    ("Mount Everest", "Mount Everest grows a few millimetres every year as the Indian plate pushes north.",
     "is the highest mountain still getting taller"),
    ("Sourdough", "Sourdough bread rises thanks to wild yeast and lactic acid bacteria in the starter.",
     "what makes sourdough bread rise"),
    ("Venus", "A day on Venus lasts longer than its year because the planet rotates very slowly.",
     "planet where a day is longer than a year"),
    ("Penicillin", "Alexander Fleming noticed in 1928 that a mould killed the bacteria in his culture dish.",
     "who discovered penicillin and how"),
    ("Tea", "Green and black tea come from the same plant; black tea leaves are oxidised before drying.",
     "difference between green tea and black tea"),
    ("Lightning", "Lightning heats the air around it to about five times the temperature of the Sun's surface.",
     "how hot is a lightning bolt"),
    ("Bamboo", "Some species of bamboo can grow almost one metre in a single day.",
     "fastest growing plant"),
    ("Coffee", "Caffeine blocks adenosine receptors in the brain, which delays the feeling of tiredness.",
     "why does coffee keep you awake"),
    ("Python lists", "The sort method orders a Python list in place, while sorted returns a new list.",
     "sort a list in python without changing the original"),
    ("Git", "git rebase replays your commits on top of another branch, rewriting their history.",
     "what does git rebase do"),
    ("Rust ownership", "In Rust every value has a single owner, and the value is dropped when the owner goes away.",
     "how does rust free memory without a garbage collector"),
    ("TCP", "TCP retransmits lost packets and delivers bytes in order; UDP does neither.",
     "difference between tcp and udp"),
    ("Photosynthesis", "Plants turn carbon dioxide and water into sugar and oxygen using energy from sunlight.",
     "how do plants make food from light"),
    ("Black holes", "Nothing, not even light, can escape from inside the event horizon of a black hole.",
     "can light escape a black hole"),
    ("Vaccines", "Vaccines train the immune system to recognise a pathogen without causing the disease.",
     "how do vaccines work"),
    ("Great Wall", "The Great Wall of China is not visible to the naked eye from low Earth orbit.",
     "can you see the great wall of china from space"),
    ("Chess", "In chess, castling moves the king two squares towards a rook, which jumps over it.",
     "how does castling work in chess"),
    ("Marathon", "The marathon distance of 42.195 km was fixed at the 1908 London Olympics.",
     "why is a marathon 42 km long"),
    ("Salt water", "Adding salt to water raises its boiling point only by a fraction of a degree.",
     "does salt make water boil faster"),
    ("Camels", "A camel's hump stores fat, not water, which the animal burns for energy.",
     "what is inside a camel hump"),
    ("Northern lights", "Auroras appear when charged particles from the Sun hit gases in the upper atmosphere.",
     "what causes the northern lights"),
    ("Sleep", "Adults need seven to nine hours of sleep; less harms memory and attention.",
     "how many hours of sleep does an adult need"),
    ("Diamonds", "Diamond and graphite are both pure carbon, with different crystal structures.",
     "what are diamonds made of"),
    ("Moon", "The Moon always shows the same face to Earth because it is tidally locked.",
     "why do we only see one side of the moon"),
    ("Penguins", "Emperor penguins huddle in large groups to survive the Antarctic winter.",
     "how do penguins stay warm"),
    ("Volcanoes", "Most volcanoes sit where tectonic plates meet, around the Pacific Ring of Fire.",
     "where are most volcanoes located"),
    ("Rainbows", "A rainbow forms when sunlight is refracted, reflected and dispersed in raindrops.",
     "how is a rainbow formed"),
    ("Spiders", "Spider silk is, for its weight, stronger than steel.",
     "is spider silk stronger than steel"),
]
EXTRA_DOCS = [
    ("Bee stings", "A honey bee dies after stinging because its barbed stinger stays in the skin."),
    ("Coffee origins", "Coffee plants were first cultivated in Yemen, from seeds brought from Ethiopia."),
    ("Python dicts", "Since Python 3.7 dictionaries keep the insertion order of their keys."),
    ("Solar system", "Jupiter is the largest planet of the solar system."),
    ("Bread", "Yeast turns sugar into carbon dioxide, which makes dough rise."),
    ("Moon landing", "Apollo 11 landed on the Moon in July 1969."),
]
SPLITS = {"train": range(0, 16), "dev": range(16, 22), "test": range(22, 30)}


def write_beir_folder(folder: Path) -> Path:
    """corpus.jsonl (36 docs), queries.jsonl (30), qrels train/dev/test; some extra relevant and score-0 rows."""
    folder.mkdir(parents=True, exist_ok=True)
    docs = [{"_id": f"d{i}", "title": title, "text": text} for i, (title, text, _) in enumerate(TOPICS)]
    docs += [{"_id": f"x{i}", "title": title, "text": text} for i, (title, text) in enumerate(EXTRA_DOCS)]
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    queries = [{"_id": f"q{i}", "text": query} for i, (_, _, query) in enumerate(TOPICS)]
    (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    (folder / "qrels").mkdir(exist_ok=True)
    for split, indices in SPLITS.items():
        rows = [f"q{i}\td{i}\t1" for i in indices]
        if split == "test":
            # a second relevant document, a judged-irrelevant one (score 0)
            rows += ["q25\tx5\t1", "q22\tx3\t0"]
        (folder / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(rows) + "\n")
    return folder


def st_evaluator_metrics(model, beir) -> dict[str, float]:
    """sentence-transformers' InformationRetrievalEvaluator on a loaded BeirSet, under our metric names."""
    from sentence_transformers.evaluation import InformationRetrievalEvaluator

    evaluator = InformationRetrievalEvaluator(
        queries=dict(zip(beir.query_ids, beir.queries, strict=True)),
        corpus=dict(zip(beir.corpus_ids, beir.corpus, strict=True)),
        relevant_docs={qid: {beir.corpus_ids[j] for j in rel} for qid, rel in zip(beir.query_ids, beir.relevant,
                                                                                  strict=True)},
        mrr_at_k=[10], ndcg_at_k=[10], accuracy_at_k=[1], precision_recall_at_k=[1, 10, 100], map_at_k=[100],
        show_progress_bar=False, name="beir",
    )
    theirs = evaluator(model)
    names = ("ndcg@10", "mrr@10", "recall@1", "recall@10", "recall@100", "map@100")
    return {name: next(v for k, v in theirs.items() if k.endswith(f"cosine_{name}")) for name in names}
