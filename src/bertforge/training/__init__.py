"""The one training loop and what it needs: optimizers, checkpoints, runs, distribution."""
