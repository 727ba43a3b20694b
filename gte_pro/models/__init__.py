"""The encoder and what changes its shape (the ``model/`` config group).

- ``encoder``: ``Encoder`` (a Hugging Face transformer, prompts, normalisation), composed from a ``backbone``
  (``Backbone``: tokenizer and transformer, LoRA, memory switches) and a head (``heads.EmbeddingHead``: pooling,
  the optional dense projection, normalisation); ``Encoder.load`` builds both from the config's keys.
- ``pooling``: token states -> one vector, and the pooling a model's sentence-transformers files declare;
  ``lora``: LoRA adapters; ``length_chunks``: per-length batch chunks.
"""

# the model group's ``_target_`` before the models were composed from parts (2026-12-06): the configs that older
# checkpoints carry name the classes, which now take the parts; their builders take those configs' keys
OLD_TARGETS = {"gte_pro.models.encoder.Encoder": "gte_pro.models.encoder.Encoder.load",
               "gte_pro.models.cross_encoder.CrossEncoder": "gte_pro.models.cross_encoder.CrossEncoder.load"}


def model_options(model: dict) -> dict:
    """A ``model/`` config part, as ``hydra.utils.instantiate`` builds the model from it: without ``lr`` (the
    optimizer's), and an old ``_target_`` (``OLD_TARGETS``) as its builder's."""
    options = {key: value for key, value in model.items() if key != "lr"}
    if "_target_" in options:
        options["_target_"] = OLD_TARGETS.get(options["_target_"], options["_target_"])
    return options
