"""Constants every layer shares. This module imports nothing, so the data code can use them
without importing the model."""

IGNORE_INDEX = -100
"""Label value meaning "no prediction here", as in transformers and PyTorch's cross-entropy."""

INFERENCE_BACKENDS = ("auto", "fused", "torch", "fused-bf16", "compiled", "onnx", "onnx-int8", "openvino", "jax")
"""What `predict --backend` and `serve --backend` take (see `backends.py`); the first is the default.
Here, not in `backends.py`, so the CLI can list them without importing torch."""
