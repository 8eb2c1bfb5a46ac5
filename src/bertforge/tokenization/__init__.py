"""Tokenizers on the `tokenizers` library, with transformers' files and call signature."""
