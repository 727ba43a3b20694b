"""The encoder and what changes its shape (the ``model/`` config group).

- ``encoder``: ``Encoder`` (a Hugging Face transformer, pooling, prompts, normalisation).
- ``heads``: the optional dense projection; ``lora``: LoRA adapters; ``length_chunks``: per-length batch chunks.
"""
