"""Exports of a trained encoder (the ``export/`` config group).

- ``writers``: sentence-transformers, plain Hugging Face and ONNX layouts, each written atomically.
- ``verify``: loading each export back and comparing embeddings; deployment checks.
- ``card``: the model card.
- ``release``: what a finished run does on rank 0 (exports + verification, metrics.md, card, checks).
"""
