"""bertforge in JAX with Flax NNX: the same BERT, the same checkpoints.

`from bertforge.jax import from_pretrained` reads any directory the torch side reads (and that
transformers reads) into an `nnx.Module`; `save_pretrained` writes one both of them load. Install
with `pip install "bertforge[jax]"`. The torch path never imports this package.

Status: the encoder and the pretraining, masked-LM and classification heads, with checkpoint
I/O both ways. The training step and `--backend jax` for the CLI are not built yet.
"""

from .bert import (BertForMaskedLM, BertForPreTraining, BertForSequenceClassification, BertModel, BertOutput,
                   HeadOutput, masked_lm_loss)
from .checkpoint import from_pretrained, save_pretrained

__all__ = ["from_pretrained", "save_pretrained", "BertModel", "BertForPreTraining", "BertForMaskedLM",
           "BertForSequenceClassification", "BertOutput", "HeadOutput", "masked_lm_loss"]
