"""Hard-negative mining: ``options`` (``mine.*`` and their checks), ``core`` (the search and the selection),
``embed`` (texts -> embeddings, sharded over ranks), ``rescore`` (a teacher judges the window: ``mine.rescore_with``),
``corpus`` (``mine.corpus_files`` streamed into a store on disk), ``problem`` (training rows + that store -> queries,
corpus, positives), ``report`` (the mined file, the report and the score plot); ``remine`` and ``pool`` re-mine
during training; ``mode=mine`` itself is ``gte_pro.modes.mine``."""
