"""Overlap matching: which training rows repeat a text of an evaluation set of the run, exactly or nearly (what
``data.decontaminate`` reports and drops: ``gte_pro.data.decontamination``).

The evaluation side is small (a held-out split or ``data.val_file`` of at most ``data.max_val_queries`` queries, and
the queries of each ``eval.beir`` set with the documents its qrels judge relevant, not the whole corpus: a training
text equal to an irrelevant corpus document gives nothing away), so it is indexed once and the training rows stream
by it. Each training field is compared with what it could leak: a training query with the evaluation queries, a
training positive or negative with the evaluation's relevant documents.

- **Normalisation** (``normalise``): NFKC, case folding, punctuation and symbols to spaces, whitespace collapsed;
  two texts that differ only in these are an *exact* duplicate (the same normalised string).
- **Near duplicates**: Jaccard similarity of the sets of word 3-grams of the normalised texts (a text of fewer words
  is one shingle), estimated by MinHash (Broder, "On the resemblance and containment of documents", 1997) with
  ``datasketch``'s ``MinHash`` and ``MinHashLSH`` (``num_perm`` permutations, bands chosen by datasketch for the
  threshold with false negatives weighted 9:1), and every LSH candidate confirmed with its exact Jaccard, so no pair
  below the threshold is reported. The default threshold 0.8 is the Jaccard at which Lee et al., "Deduplicating
  Training Data Makes Language Models Better" (ACL 2022), call two documents near duplicates.
- **Why word 3-grams, not character 5-grams**: both find a passage with a few words changed (one changed word in 40
  removes 3 of 38 word 3-grams: Jaccard 0.85), and at 0.8 neither calls a 10-word query with one word swapped a
  near duplicate (0.45 as word 3-grams, ~0.7 as character 5-grams). But character 5-grams are shared by almost any
  two texts of one language: on the benchmark's synthetic rows nearly every training text passed the filter below
  (610 rows/s, 20,000 rows on 2 shared cores), while word 3-grams are specific enough that only real candidates
  pass (4,500 rows/s on the same rows).
- **Cost**: the shingles of a chunk of texts are hashed with numpy (polynomial hashes modulo 2**64, no Python loop
  per word). A training text reaches MinHash only if its prefix filter passes (``EvalIndex._prefixes``: the
  rarest shingles of two sets with a Jaccard >= t must meet), so most rows cost one normalisation and a few
  vectorised lookups.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from datasketch import MinHash, MinHashLSH

NGRAM = 3
SHINGLES = f"word {NGRAM}-grams of the normalised text"
FIELDS = ("query", "positive", "negative")
EXAMPLES = 3  # per set, field and kind
_NOT_WORD = re.compile(r"[^\w\s]+")
_MIX = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: the high 32 bits of h * _MIX spread the n-gram codes
_BASE = np.uint64(1_000_003)
_BASE_INVERSE = np.uint64(pow(1_000_003, -1, 2**64))


def normalise(text: str) -> str:
    """NFKC, case-folded, punctuation and symbols replaced by spaces, whitespace collapsed to one space."""
    return " ".join(_NOT_WORD.sub(" ", unicodedata.normalize("NFKC", text).casefold()).split())


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    values = np.sort(values)  # a sort and a mask: numpy 2's hashing np.unique is ~10x slower on 10**7 keys
    return values[np.concatenate(([True], values[1:] != values[:-1]))] if len(values) else values


def _word_hashes(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(64-bit polynomial hash, text number) of each word of ``codes`` (texts joined by newlines, words by spaces):
    the hash of codes[s:e] is B**(e-1) * (G[e] - G[s]) with G the prefix sums of c[j] * B**-j, all modulo 2**64
    (B is odd, so it has an inverse there), so no word is hashed in Python."""
    separator = (codes == 32) | (codes == 10)
    before = np.concatenate(([True], separator[:-1]))
    after = np.concatenate((separator[1:], [True]))
    starts = np.flatnonzero(~separator & before)
    ends = np.flatnonzero(~separator & after) + 1
    with np.errstate(over="ignore"):
        one = np.ones(1, dtype=np.uint64)
        powers = np.concatenate((one, np.cumprod(np.full(len(codes), _BASE, dtype=np.uint64))))  # B**0 .. B**n
        inverse = np.concatenate((one, np.cumprod(np.full(len(codes), _BASE_INVERSE, dtype=np.uint64))))[:-1]
        prefix = np.concatenate(([np.uint64(0)], np.cumsum(codes * inverse, dtype=np.uint64)))
        words = powers[ends - 1] * (prefix[ends] - prefix[starts])
    text_of = np.cumsum(codes == 10)[starts] if len(starts) else np.zeros(0, np.int64)
    return words, text_of


def shingle_keys(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct word 3-grams of each normalised, non-empty text (a text of fewer words is one shingle) as 32-bit
    hashes, for all texts at once: (text of each, hash of each, sorted by text then hash; ``bounds[i]:bounds[i+1]``
    are text i's). The same values on every machine and in every process."""
    codes = np.frombuffer("\n".join(texts).encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
    words, text_of = _word_hashes(codes)
    count = len(words)
    first = np.searchsorted(text_of, np.arange(len(texts)))
    sizes = np.bincount(text_of, minlength=len(texts))
    shifted = [np.concatenate((words[k:], np.zeros(k, np.uint64))) for k in range(NGRAM)]
    same = [np.concatenate((text_of[k:] == text_of[:count - k], np.zeros(k, bool))) for k in range(NGRAM)]
    with np.errstate(over="ignore"):
        gram = np.zeros(count, dtype=np.uint64)
        for k in range(NGRAM):
            gram = (gram + np.where(same[k], shifted[k], np.uint64(0))) * _MIX
    whole = np.zeros(count, bool)
    whole[first[sizes < NGRAM]] = True  # a text shorter than one n-gram is one shingle
    keep = same[NGRAM - 1] | whole
    keys = _sorted_unique((text_of[keep].astype(np.uint64) << np.uint64(32)) | (gram[keep] >> np.uint64(32)))
    text_of = (keys >> np.uint64(32)).astype(np.int64)
    bounds = np.searchsorted(text_of, np.arange(len(texts) + 1))
    return text_of, (keys & np.uint64(0xFFFFFFFF)).astype(np.uint32), bounds


def shingle_sets(texts: Sequence[str]) -> list[np.ndarray]:
    """Per normalised text, the sorted distinct hashes of its character 5-grams (``shingle_keys``)."""
    _, hashes, bounds = shingle_keys(texts)
    return [hashes[bounds[i] : bounds[i + 1]] for i in range(len(texts))]


def prefix_lengths(sizes: np.ndarray, threshold: float) -> np.ndarray:
    """How many of a set's shingles, rarest first, must include one of another set's for a Jaccard >= threshold."""
    return sizes - np.ceil(threshold * sizes - 1e-9).astype(np.int64) + 1


@dataclass
class Match:
    """One evaluation text a training text repeats: its set, the text, exact or near, and the Jaccard."""

    set_name: str
    text: str
    kind: str  # "exact" or "near"
    jaccard: float


class EvalIndex:
    """The texts of one kind (queries, or relevant documents) of every evaluation set: exact lookup by normalised
    text, a prefix filter and MinHash LSH for near duplicates."""

    def __init__(self, entries: Sequence[tuple[str, str]], threshold: float, num_perm: int) -> None:
        self.threshold = threshold
        self.entries: list[tuple[str, str]] = []  # (set name, original text)
        self.exact: dict[str, list[int]] = {}
        normalised = []
        for set_name, text in entries:
            norm = normalise(text)
            if norm:
                self.exact.setdefault(norm, []).append(len(self.entries))
                self.entries.append((set_name, text))
                normalised.append(norm)
        text_of, hashes, bounds = shingle_keys(normalised)
        self.shingles = [hashes[bounds[i] : bounds[i + 1]] for i in range(len(normalised))]
        self.vocabulary, self.frequency = np.unique(hashes, return_counts=True)
        self.prefixes = _sorted_unique(self._prefixes(text_of, hashes, bounds)[1])
        self.template = MinHash(num_perm=num_perm, seed=1, hashfunc=int)
        # recall first: every candidate is confirmed with its exact Jaccard, so a false positive costs one check
        self.lsh = MinHashLSH(threshold=threshold, num_perm=num_perm, weights=(0.1, 0.9))
        with self.lsh.insertion_session() as session:
            for key, shingles in enumerate(self.shingles):
                session.insert(key, self.minhash(shingles), check_duplication=False)

    def _prefixes(self, text_of: np.ndarray, hashes: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(text, hash) of the shingles in each text's prefix: its rarest on the evaluation side first (ties by hash).
        Two sets with a Jaccard >= threshold share a shingle of their prefixes (Chaudhuri et al., "A primitive
        operator for similarity joins in data cleaning", ICDE 2006; Bayardo et al., "Scaling up all pairs
        similarity search", WWW 2007): a training text whose prefix holds no evaluation prefix shingle is done."""
        found = np.searchsorted(self.vocabulary, hashes).clip(0, max(len(self.vocabulary) - 1, 0))
        known = self.vocabulary[found] == hashes if len(self.vocabulary) else np.zeros(len(hashes), bool)
        sizes = np.diff(bounds)
        # a prefix of shingles unknown to the evaluation side (the rarest, so first) holds no shared shingle: only the
        # texts with more than size - prefix known shingles can pass, and only theirs are sorted
        passing = np.bincount(text_of[known], minlength=len(sizes)) > sizes - prefix_lengths(sizes, self.threshold)
        rows = np.flatnonzero(passing[text_of])
        text_of, hashes = text_of[rows], hashes[rows]
        frequency = np.where(known[rows], self.frequency[found[rows]] if len(self.vocabulary) else 0, 0)
        order = np.lexsort((hashes, frequency, text_of))
        rank = np.arange(len(order)) - np.searchsorted(text_of, text_of)[order]
        keep = order[rank < prefix_lengths(sizes, self.threshold)[text_of[order]]]
        return text_of[keep], hashes[keep]

    def minhash(self, shingles: np.ndarray) -> MinHash:
        signature = self.template.copy()
        signature.update_batch(shingles.tolist())
        return signature

    def match(self, texts: Sequence[str]) -> list[list[Match]]:
        """Per training text, the evaluation texts it repeats (exact ones; near ones only for a text without)."""
        found: list[list[Match]] = [[] for _ in texts]
        normalised = [normalise(text) for text in texts]
        screened = []
        for i, norm in enumerate(normalised):
            for key in self.exact.get(norm, ()):
                found[i].append(Match(self.entries[key][0], self.entries[key][1], "exact", 1.0))
            if norm and not found[i]:
                screened.append(i)
        if not screened or not self.entries:
            return found
        text_of, hashes, bounds = shingle_keys([normalised[i] for i in screened])
        prefix_text, prefix_hash = self._prefixes(text_of, hashes, bounds)
        for j in np.unique(prefix_text[np.isin(prefix_hash, self.prefixes)]):
            found[screened[j]] = self._near(hashes[bounds[j] : bounds[j + 1]])
        return found

    def _near(self, own: np.ndarray) -> list[Match]:
        matches = []
        for key in self.lsh.query(self.minhash(own)):
            other = self.shingles[key]
            shared = len(np.intersect1d(own, other, assume_unique=True))
            jaccard = shared / (len(own) + len(other) - shared)
            if jaccard >= self.threshold:
                matches.append(Match(self.entries[key][0], self.entries[key][1], "near", round(jaccard, 4)))
        return matches


@dataclass
class Overlap:
    """What a scan found: per (set, field, kind) the rows counted and the first examples; the rows that overlap."""

    sets: dict[str, dict[str, int]]  # set name -> {"queries": n, "documents": n}
    counts: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    rows: list[int] = field(default_factory=list)  # training rows with any overlap, ascending
    by_field: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FIELDS, 0))

    def add(self, row: int, field_name: str, train_text: str, matches: Iterable[Match], seen: set) -> None:
        for match in matches:
            if (match.set_name, field_name, match.kind) in seen:
                continue  # one count per row, set, field and kind (two negatives of a row repeat one document)
            seen.add((match.set_name, field_name, match.kind))
            per_set = self.counts.setdefault(match.set_name, {f: {"exact": 0, "near": 0} for f in FIELDS})
            per_set[field_name][match.kind] += 1
            shown = self.examples.setdefault(match.set_name, [])
            if sum(1 for e in shown if e["field"] == field_name and e["kind"] == match.kind) < EXAMPLES:
                shown.append({"field": field_name, "kind": match.kind, "row": row, "train": train_text[:200],
                              "eval": match.text[:200], "jaccard": match.jaccard})


def scan(rows: Iterable[tuple[int, str, list[str], list[str]]], queries: EvalIndex, documents: EvalIndex,
         sets: dict[str, dict[str, int]], chunk: int = 2048) -> Overlap:
    """Compare each training row (index, query, positives, negatives) with the evaluation side."""
    overlap = Overlap(sets)
    batch: list[tuple[int, str, list[str], list[str]]] = []
    for row in rows:
        batch.append(row)
        if len(batch) == chunk:
            _scan_chunk(batch, queries, documents, overlap)
            batch = []
    if batch:
        _scan_chunk(batch, queries, documents, overlap)
    return overlap


def _scan_chunk(batch: list[tuple[int, str, list[str], list[str]]], queries: EvalIndex, documents: EvalIndex,
                overlap: Overlap) -> None:
    query_matches = queries.match([query for _, query, _, _ in batch])
    docs = [(i, name, text) for i, (_, _, positives, negatives) in enumerate(batch)
            for name, texts in (("positive", positives), ("negative", negatives)) for text in texts]
    doc_matches = documents.match([text for _, _, text in docs])
    seen: list[set] = [set() for _ in batch]
    for i, (row, query, _, _) in enumerate(batch):
        overlap.add(row, "query", query, query_matches[i], seen[i])
    for (i, name, text), matches in zip(docs, doc_matches, strict=True):
        overlap.add(batch[i][0], name, text, matches, seen[i])
    for i, (row, *_) in enumerate(batch):
        if seen[i]:
            overlap.rows.append(row)
            for name in {field_name for _, field_name, _ in seen[i]}:
                overlap.by_field[name] += 1
