"""bertforge in JAX with Flax NNX: the same BERT, the same checkpoints.

`from bertforge.jax import from_pretrained` reads any directory the torch side reads (and that
transformers reads) into an `nnx.Module`; `save_pretrained` writes one both of them load. Install
with `pip install "bertforge[jax]"`. The torch path never imports this package.

What is here: the encoder and the pretraining, masked-LM and classification heads, with checkpoint
I/O both ways (`bert.py`, `checkpoint.py`); the jitted training step (`train.py`) and the engine that
puts it in bertforge's one training loop (`loop.py`), which `pretrain --backend jax` and
`finetune classify --backend jax` use, with exact resume and data parallelism over JAX's devices
(`devices.py`). See docs/jax.md for what it covers and what it refuses.
"""

from .bert import (BertForMaskedLM, BertForPreTraining, BertForSequenceClassification, BertModel, BertOutput,
                   HeadOutput, masked_lm_loss)
from .checkpoint import from_pretrained, save_pretrained

__all__ = ["from_pretrained", "save_pretrained", "BertModel", "BertForPreTraining", "BertForMaskedLM",
           "BertForSequenceClassification", "BertOutput", "HeadOutput", "masked_lm_loss"]
