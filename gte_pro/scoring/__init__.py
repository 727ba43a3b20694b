"""Teacher scores for distillation (``mode=score``): ``shards`` (the input in fixed shards, their files in the run
folder, resuming, the output assembled from them), ``core`` (a shard's pairs through the teacher, this rank's
shards), ``pair_scoring`` (every pair of a job through the teacher, collectively across ranks: also what
``mode=mine mine.rescore_with=`` rescores with), ``report`` (the report and the score histograms); the mode itself
is ``gte_pro.modes.score``."""
