"""Constants every layer shares. This module imports nothing, so the data code can use them
without importing the model."""

IGNORE_INDEX = -100
"""Label value meaning "no prediction here", as in transformers and PyTorch's cross-entropy."""
