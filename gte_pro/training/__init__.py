"""What happens inside ``trainer.fit``: the Lightning module and the pieces of its training step.

- ``module``: ``ContrastiveModule`` (training step, validation, optimizer and schedule).
- ``losses``: the contrastive losses (the ``loss/`` config group); ``gradcache``: the cached loss for large
  batches in small mini-batches.
- ``guard``: skipping non-finite steps; ``callbacks``: throughput lines, the progress bar, validation records.
"""
