"""The architectures: shared layers, one module per family, heads, and the registry. Imports torch only."""
