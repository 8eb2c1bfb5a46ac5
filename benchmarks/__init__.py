"""Side-by-side measurements against transformers and ONNX Runtime. Run each as `python -m benchmarks.NAME`."""
