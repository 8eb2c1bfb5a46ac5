"""What more than one benchmark script uses: one module per subject (training, inference, family, retrieval,
fine-tuning). Scripts import from here and from ..common, never from each other."""
