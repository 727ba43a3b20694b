"""Checking a composed config before anything is built: ``checks`` (types, ranges, unknown keys) and ``rules``
(the cross-key rules it applies)."""
