"""Retrieval evaluation (the ``eval/`` config group).

- ``metrics``: the IR metrics of a ranking, and ``evaluate_distributed`` (validation under DDP); the ranking itself
  is ``gte_pro.retrieval``. ``quantize``: quantized embeddings (``eval.quantization``).
- ``rows``: a rank's validation outputs (signed ids, embeddings) in one preallocated buffer.
- ``sets``: the BEIR sets named in ``eval.beir`` and the data module that serves them.
- ``report``: flat logged metrics -> a markdown table, one row per set.
"""
