"""BERT's encoder in plain NumPy, written to be read, and used by the tests as an independent oracle.

It takes weights under transformers' names (as `bertforge.interop.hf.to_hf_state_dict` or any
HF checkpoint gives them) and computes everything in float64, so it shares no code
path with the torch model: no SDPA, no nn.Linear, no torch at all.
"""

from __future__ import annotations

import math

import numpy as np

_erf = np.frompyfunc(math.erf, 1, 1)


def gelu(x: np.ndarray) -> np.ndarray:
    """Exact GELU: x * Phi(x) = x/2 * (1 + erf(x / sqrt 2))."""
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(x.dtype))


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)  # biased variance, as in BERT
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def linear(x: np.ndarray, w: dict[str, np.ndarray], name: str) -> np.ndarray:
    """y = x W^T + b, with W stored [out, in] as in PyTorch."""
    return x @ w[name + ".weight"].T + w[name + ".bias"]


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def bert_forward(weights: dict[str, np.ndarray], config, input_ids: np.ndarray,
                 token_type_ids: np.ndarray | None = None,
                 attention_mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """input_ids [B, T] -> (last hidden state [B, T, H], pooler output [B, H]).

    `weights` uses transformers' backbone names without the `bert.` prefix.
    """
    w = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}
    B, T = input_ids.shape
    H, nh = config.hidden_size, config.num_attention_heads
    hd = H // nh
    eps = config.layer_norm_eps
    if token_type_ids is None:
        token_type_ids = np.zeros_like(input_ids)
    if attention_mask is None:
        attention_mask = np.ones_like(input_ids)

    # Embeddings: the sum of three lookups, normalised.
    x = (w["embeddings.word_embeddings.weight"][input_ids]
         + w["embeddings.position_embeddings.weight"][np.arange(T)][None]
         + w["embeddings.token_type_embeddings.weight"][token_type_ids])
    x = layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)

    # Padding keys get -inf before the softmax, so no query attends to them.
    key_bias = np.where(attention_mask[:, None, None, :] > 0, 0.0, -np.inf)  # [B, 1, 1, T]

    for i in range(config.num_hidden_layers):
        p = f"encoder.layer.{i}."

        def heads(t: np.ndarray) -> np.ndarray:  # [B, T, H] -> [B, nh, T, hd]
            return t.reshape(B, T, nh, hd).transpose(0, 2, 1, 3)

        q = heads(linear(x, w, p + "attention.self.query"))
        k = heads(linear(x, w, p + "attention.self.key"))
        v = heads(linear(x, w, p + "attention.self.value"))
        probs = softmax(q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd) + key_bias)  # [B, nh, T, T]
        context = (probs @ v).transpose(0, 2, 1, 3).reshape(B, T, H)
        attended = linear(context, w, p + "attention.output.dense")
        x = layer_norm(x + attended, w[p + "attention.output.LayerNorm.weight"],
                       w[p + "attention.output.LayerNorm.bias"], eps)
        ffn = linear(gelu(linear(x, w, p + "intermediate.dense")), w, p + "output.dense")
        x = layer_norm(x + ffn, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], eps)

    pooled = np.tanh(linear(x[:, 0], w, "pooler.dense"))
    return x, pooled
