"""Data: corpora, and the readers and collators that turn them into model inputs."""
