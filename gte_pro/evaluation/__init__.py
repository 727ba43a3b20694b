"""Retrieval evaluation (the ``eval/`` config group).

- ``metrics``: ranking a corpus, the IR metrics, sharded ranking under DDP.
- ``sets``: the BEIR sets named in ``eval.beir`` and the data module that serves them.
- ``report``: flat logged metrics -> a markdown table, one row per set.
"""
