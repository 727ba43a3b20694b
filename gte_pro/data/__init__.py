"""Training data (the ``data/`` config group): a data module made of parts, one row source per kind of data.

- ``records``: reading, validating and cleaning (query, positive[, negatives]) rows; ``split``: the hash split.
- ``sources``: a row source; ``demo``, ``jsonl``, ``hf``, ``beir``: one per kind (``data._target_``).
- ``token_cache``: cleaning, the validation split, tokenizing and decontaminating a source's rows into ``cache``,
  the memory-mapped token cache.
- ``batching`` (+ ``datasets``, ``collate``, ``sampling``): the token cache's rows -> training batches.
- ``validation``: the held-out split and the named evaluation sets, as validation loaders.
- ``base``: the data module of those parts; ``mix`` (+ ``mix_sampling``): several sources in one run.
- ``collaborators``: the protocols of what higher floors hand a data module when it is built (negative pools, a
  reranker's pair joining and candidates, named evaluation sets).
- ``docstrings``: parsing docstrings with ``ast`` (``demo`` and ``pydocs``, the offline set of confusable API docs).

``gte_pro.modes.build_data`` builds a data module from a run's ``data.*`` settings.
"""
