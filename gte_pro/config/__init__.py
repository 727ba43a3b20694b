"""The config before anything is built: ``schema`` (the typed schema of each group in Hydra's ConfigStore),
``checks`` (ranges, choices, unknown keys, named by key) and ``rules`` (the cross-key rules it applies)."""
