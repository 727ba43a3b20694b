"""Hard-negative mining: ``core`` (the search and the selection), ``embed`` (texts -> embeddings, sharded over
ranks), ``problem`` (training rows + corpus files -> queries, corpus, positives), ``report`` (the mined file, the
report and the score plot) and ``run`` (``mode=mine``); ``remine`` and ``pool`` re-mine during training."""
