"""Small helpers shared across the package: atomic file writes, markdown tables."""
