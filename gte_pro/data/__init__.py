"""Training data (the ``data/`` config group): one module per source, plus the shared machinery.

- ``records``: reading, validating and cleaning (query, positive[, negatives]) rows; ``split``: the hash split.
- ``cache``: the memory-mapped token cache; ``datasets``, ``collate``, ``sampling``: rows -> batches.
- ``base``: the base Lightning data module; ``demo``, ``jsonl``, ``hf``, ``beir``: one module per source; ``mix``
  (+ ``mix_sampling``): several sources in one run.
- ``collaborators``: the protocols of what higher floors hand a data module when it is built (negative pools, a
  reranker's pair joining and candidates, named evaluation sets).
- ``docstrings``: parsing docstrings with ``ast`` (``demo`` and ``pydocs``, the offline set of confusable API docs).
"""
