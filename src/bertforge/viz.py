"""Pictures: training curves from metrics.jsonl, and attention views (a PNG grid, a static HTML page)."""

from __future__ import annotations

import json
from pathlib import Path

from .safefiles import atomic_write, write_text


def plot_curves(metrics_file: Path, out_png: Path, title: str = "training") -> Path | None:
    """Loss curves (train parts and eval) and, when present, eval accuracies, side by side."""
    rows = [json.loads(line) for line in metrics_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # The total and its parts: MLM, NSP or sentence order, replaced-token detection, distillation's soft and gold.
    parts = ("loss", "mlm_loss", "nsp_loss", "sop_loss", "rtd_loss", "soft_loss", "gold_loss", "cos_loss")
    losses = [k for k in parts if any(k in r for r in rows)]
    evals = sorted({k for r in rows for k in r if k.startswith("eval_") and ("loss" in k)})
    scores = sorted({k for r in rows for k in r if k.startswith("eval_") and ("acc" in k or "f1" in k or k.endswith("_corr"))})
    fig, axes = plt.subplots(1, 2 if scores else 1, figsize=(12 if scores else 7, 4.5), squeeze=False)
    ax = axes[0][0]
    for key in losses + evals:
        points = [(r["step"], r[key]) for r in rows if key in r and r[key] is not None]
        if points:
            ax.plot(*zip(*points), label=key, marker="o" if key.startswith("eval_") else None, markersize=3)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(f"{title}: loss")
    ax.grid(alpha=0.3)
    ax.legend()
    if scores:
        ax = axes[0][1]
        for key in scores:
            points = [(r["step"], r[key]) for r in rows if key in r]
            ax.plot(*zip(*points), label=key, marker="o", markersize=3)
        ax.set_xlabel("step")
        ax.set_title(f"{title}: held-out metrics")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    atomic_write(out_png, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
    return out_png


# ----------------------------------------------------------------------------- attention
def attention_maps(model, tokenizer, text: str, pair: str | None = None):
    """(WordPiece tokens, attention probabilities float [layers, heads, T, T]) for one input."""
    import torch

    backbone = getattr(model, "backbone", model)
    backbone.eval()
    enc = tokenizer(text, pair, truncation=True, max_length=backbone.config.max_sequence_length,
                    return_tensors="pt", return_token_type_ids=True)
    with torch.no_grad():
        out = backbone(enc["input_ids"], enc["token_type_ids"], output_attentions=True)
    attn = torch.stack(out.attentions)[:, 0].float().numpy()  # (L, heads, T, T)
    return tokenizer.convert_ids_to_tokens(enc["input_ids"][0].tolist()), attn


def plot_attention(tokens: list[str], attn, out_png: Path, layer: int | None = None, head: int | None = None) -> Path:
    """A PNG: one large heatmap (a chosen layer and head, or a layer's head average) with the tokens
    on both axes, or the full grid of layers x heads when neither is chosen."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    L, H, T, _ = attn.shape
    if layer is not None or head is not None:
        layer = L - 1 if layer is None else layer
        grid = attn[layer].mean(0) if head is None else attn[layer, head]
        size = max(5.0, 0.32 * T + 2)
        fig, ax = plt.subplots(figsize=(size + 1, size))
        image = ax.imshow(grid, cmap="viridis", vmin=0, vmax=max(float(grid.max()), 1e-9))
        ax.set_xticks(range(T), tokens, rotation=90, fontsize=8)
        ax.set_yticks(range(T), tokens, fontsize=8)
        ax.set_xlabel("attended to (key)")
        ax.set_ylabel("attending (query)")
        ax.set_title(f"layer {layer + 1}, {'mean of heads' if head is None else f'head {head + 1}'}")
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    else:
        cell = 1.6 if T <= 24 else 1.2
        fig, axes = plt.subplots(L, H, figsize=(cell * H + 1, cell * L + 1), squeeze=False)
        for i in range(L):
            for j in range(H):
                ax = axes[i][j]
                ax.imshow(attn[i, j], cmap="viridis", vmin=0, vmax=1)
                ax.set_xticks([])
                ax.set_yticks([])
                if i == 0:
                    ax.set_title(f"head {j + 1}", fontsize=9)
                if j == 0:
                    ax.set_ylabel(f"layer {i + 1}", fontsize=9)
        if T <= 24:  # tokens on the axes of the first map, where they stay legible
            axes[-1][0].set_xticks(range(T), tokens, rotation=90, fontsize=5)
            axes[-1][0].set_yticks(range(T), tokens, fontsize=5)
        fig.suptitle(" ".join(tokens)[:160], fontsize=10)
    fig.tight_layout()
    atomic_write(out_png, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    plt.close(fig)
    return out_png


_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>bertforge attention</title>
<style>
 body { font: 14px system-ui, sans-serif; margin: 24px; color: #222; }
 .controls { margin-bottom: 14px; display: flex; gap: 16px; align-items: center; }
 table { border-collapse: collapse; }
 td { width: 22px; height: 22px; padding: 0; }
 th { font-weight: normal; font-size: 12px; padding: 2px 4px; white-space: nowrap; }
 th.col { writing-mode: vertical-rl; transform: rotate(180deg); text-align: left; }
 td:hover { outline: 2px solid #e4572e; }
 #value { min-width: 220px; color: #555; }
</style></head><body>
<h2>Attention: <span id="sentence"></span></h2>
<div class="controls">
 <label>Layer <select id="layer"></select></label>
 <label>Head <select id="head"></select></label>
 <span id="value">hover a cell</span>
</div>
<table id="map"></table>
<p>Rows attend (queries), columns are attended to (keys); each row sums to 1.</p>
<script id="data" type="application/json">__DATA__</script>
<script>
const data = JSON.parse(document.getElementById("data").textContent);
const tokens = data.tokens, attn = data.attention;  // [layer][head][query][key]
const layerSel = document.getElementById("layer"), headSel = document.getElementById("head");
document.getElementById("sentence").textContent = tokens.join(" ");
attn.forEach((_, i) => layerSel.add(new Option(String(i + 1), i)));
headSel.add(new Option("mean", -1));
attn[0].forEach((_, j) => headSel.add(new Option(String(j + 1), j)));
layerSel.value = attn.length - 1;
function colour(v) {  // white -> deep blue
  const t = Math.sqrt(Math.max(0, Math.min(1, v)));
  return `rgb(${Math.round(255 - 225 * t)},${Math.round(255 - 170 * t)},${Math.round(255 - 60 * t)})`;
}
function draw() {
  const l = +layerSel.value, h = +headSel.value, n = tokens.length;
  const grid = h >= 0 ? attn[l][h] : attn[l][0].map((row, q) => row.map((_, k) =>
    attn[l].reduce((s, head) => s + head[q][k], 0) / attn[l].length));
  const table = document.getElementById("map");
  table.innerHTML = "";
  const head = table.insertRow();
  head.appendChild(document.createElement("th"));
  tokens.forEach(t => { const th = document.createElement("th"); th.className = "col"; th.textContent = t; head.appendChild(th); });
  for (let q = 0; q < n; q++) {
    const row = table.insertRow();
    const th = document.createElement("th"); th.textContent = tokens[q]; row.appendChild(th);
    for (let k = 0; k < n; k++) {
      const cell = row.insertCell();
      cell.style.background = colour(grid[q][k]);
      cell.dataset.v = grid[q][k].toFixed(4);
      cell.onmouseenter = () => { document.getElementById("value").textContent =
        `${tokens[q]} \\u2192 ${tokens[k]}: ${grid[q][k].toFixed(3)}`; };
    }
  }
}
layerSel.onchange = draw; headSel.onchange = draw; draw();
</script></body></html>
"""


def write_attention_html(tokens: list[str], attn, out_html: Path) -> Path:
    """A static page (no server, no network) with layer and head pickers over the heatmap."""
    import json

    data = {"tokens": tokens, "attention": [[[[round(float(v), 4) for v in row] for row in head] for head in layer]
                                            for layer in attn]}
    payload = json.dumps(data).replace("</", "<\\/")  # never close the script tag from inside the data
    write_text(out_html, _HTML.replace("__DATA__", payload))
    return Path(out_html)
