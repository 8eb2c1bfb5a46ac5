"""The one inference loop, the pipelines, the backends (fused, compiled, ONNX, OpenVINO, JAX) and export."""
