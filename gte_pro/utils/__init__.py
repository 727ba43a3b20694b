"""The ground floor: helpers that know nothing of models, data or runs.

- ``files``: atomic writes of files, folders and stores (``published_folder``), ``WriteError``.
- ``shared_cache``: caches shared between processes, built once under a lock per key and checked (sizes, xxh3)
  before they are read (``shared_folder``, ``shared_file``).
- ``distributed``: "are we distributed?" (``world``, ``is_distributed``).
- ``progress``, ``timing``, ``quiet``: logging cadence, phase times and memory, third-party noise.
- ``tables``, ``plots``, ``secrets``: markdown tables, the training-curve and sweep plots, redacting secrets.
"""
