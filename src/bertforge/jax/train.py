"""The JAX training step: one `nnx.jit`-compiled optimizer step over a stack of micro-batches.

It follows the torch loop (`bertforge/training/trainer.py`) term by term, so the two take the same steps:
- the loss is the model's (masked MLM over labelled positions, plus NSP);
- gradient accumulation averages the micro-batches' gradients, as `(loss / accum).backward()` does;
- clipping scales by min(1, max_norm / (global norm + 1e-6)), as `clip_grad_norm_`;
- AdamW (betas 0.9/0.999, eps 1e-6), with decay only on matrices and embeddings (no biases,
  no LayerNorm), decoupled, as torch's AdamW with bertforge's parameter groups;
- the rate is the caller's, from the same schedule (`optim.warmup_linear`): linear warmup from 0,
  linear decay to 0 at the last step.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx


def decay_mask(params: Any) -> Any:
    """True for matrices and embeddings (2-D and up), False for biases and LayerNorm parameters."""
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(model: nnx.Module, weight_decay: float = 0.01) -> nnx.Optimizer:
    """AdamW whose rate each step sets (`train_step(..., lr=...)`), as the torch loop sets its
    param groups' rate: so a schedule fixed only after the first steps (a time budget) works too."""
    tx = optax.inject_hyperparams(optax.adamw)(learning_rate=0.0, b1=0.9, b2=0.999, eps=1e-6,
                                               weight_decay=weight_decay, mask=decay_mask)
    return nnx.Optimizer(model, tx, wrt=nnx.Param)


def _loss(model: nnx.Module, batch: dict[str, jax.Array]):
    out = model(**batch)
    parts = {k: getattr(out, k) for k in ("mlm_loss", "nsp_loss") if getattr(out, k, None) is not None}
    return out.loss, parts


@nnx.jit(static_argnames=("max_grad_norm",))
def train_step(model: nnx.Module, optimizer: nnx.Optimizer, micro_batches: dict[str, jax.Array], lr: float,
               max_grad_norm: float = 1.0) -> dict[str, jax.Array]:
    """One optimizer step at rate `lr`. `micro_batches`: arrays [accum, batch, ...]; returns the mean
    loss (and its parts) over the micro-batches, and the gradient norm before clipping."""
    accum = next(iter(micro_batches.values())).shape[0]
    grads, losses, parts = None, [], []
    for i in range(accum):  # unrolled at trace time: accum is part of the shapes
        (loss, part), g = nnx.value_and_grad(_loss, has_aux=True)(model, {k: v[i] for k, v in micro_batches.items()})
        grads = g if grads is None else jax.tree.map(jnp.add, grads, g)
        losses.append(loss)
        parts.append(part)
    grads = jax.tree.map(lambda g: g / accum, grads)
    norm = optax.global_norm(grads)
    if max_grad_norm > 0:
        scale = jnp.minimum(1.0, max_grad_norm / (norm + 1e-6))
        grads = jax.tree.map(lambda g: g * scale, grads)
    optimizer.opt_state.hyperparams["learning_rate"][...] = lr
    optimizer.update(model, grads)
    out = {"loss": jnp.mean(jnp.stack(losses)), "grad_norm": norm}
    for key in parts[0]:
        out[key] = jnp.mean(jnp.stack([p[key] for p in parts]))
    return out
