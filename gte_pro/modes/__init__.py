"""What a run does (``cfg.mode``): one module per mode, all built from the config the same way.

- ``build``: config -> encoder, data module, Lightning module, callbacks, loggers, trainer (shared by every mode
  and the benchmarks).
- ``fit``: ``mode=train`` (validate, fit, validate the best checkpoint, export).
- ``evaluate``: ``mode=eval`` (evaluate any encoder, write metrics.json + metrics.md).
- ``mine``: ``mode=mine`` (hard negatives for the training rows).
- ``score``: ``mode=score`` (teacher scores for the training rows: pos_scores / neg_scores).
- ``merge``: ``mode=merge`` (a model soup of fine-tunes: uniform, greedy or slerp; validated and exported).
"""
