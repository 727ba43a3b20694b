"""The encoder and what changes its shape (the ``model/`` config group).

- ``encoder``: ``Encoder`` (a Hugging Face transformer, prompts, normalisation); ``pooling``: token states -> one
  vector, and the pooling a model's sentence-transformers files declare.
- ``heads``: the optional dense projection; ``lora``: LoRA adapters; ``length_chunks``: per-length batch chunks.
"""
