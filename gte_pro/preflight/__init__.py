"""Pre-flight: the checks and choices made after the config is resolved and before the model's weights load, on
the run's one data module (config -> resolve -> pre-flight -> build -> mode).

- ``memory_estimate``: what one device holds (weights, optimizer, activations, loss), from the model's shape on the
  meta device; ``per_device``: the per-device work of a composed config (texts, rows, mini-batch, shards);
- ``batch_lengths``: the token lengths of the batches the run will train on, read from the data module's token
  cache through its public interface;
- ``memory_budget``: the estimate judged against ``trainer.memory_budget``, the refusal and the options that fit;
- ``auto_mini_batch``: ``loss.mini_batch_size=auto`` chosen from the estimate (kept in the run folder for a resume).
"""
