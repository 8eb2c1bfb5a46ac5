"""The inference benchmarks' shared parts: SST-2 dev, its batches, a matmul peak, the SST-2 classifier accuracy check
and the side-by-side measure run.py and inference.py share."""

from __future__ import annotations

import importlib.util
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bertforge import BertConfig, Tokenizer
from bertforge.inference.export import export_onnx
from bertforge.inference.fused import fuse_for_inference

from ..common import DATA, machine, minilm_dir, need
from .engines import ctranslate2_encoder, timed_apart


def sst2() -> tuple[list[str], list[int]]:
    rows = [line.split("\t") for line in need(DATA / "glue/SST-2/dev.tsv").read_text(encoding="utf-8").splitlines()[1:]]
    return [r[0] for r in rows], [int(r[1]) for r in rows]


def batches(tokenizer: Tokenizer, texts: list[str], size: int, sort: bool) -> list[dict[str, np.ndarray]]:
    order = sorted(range(len(texts)), key=lambda i: len(tokenizer.encode(texts[i]))) if sort else range(len(texts))
    order = list(order)
    out = []
    for start in range(0, len(order), size):
        enc = tokenizer([texts[i] for i in order[start:start + size]], padding=True, truncation=True, return_tensors="np")
        out.append({k: enc[k] for k in ("input_ids", "token_type_ids", "attention_mask")})
    return out


def matmul_peak() -> float:
    """fp32 GFLOP/s of a 2048^3 matmul: the best of 20, since a peak is what the hardware can do."""
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(20):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return 2 * 2048 ** 3 / min(times) / 1e9


def model_flops(config, data) -> float:
    """Forward FLOPs of the real tokens: 2 x (non-embedding matmul weights) per token, plus attention."""
    L, H, F = config.num_hidden_layers, config.hidden_size, config.intermediate_size
    per_token = 2 * L * (4 * H * H + 2 * H * F)
    total = 0.0
    for b in data:
        lengths = b["attention_mask"].sum(1)
        total += per_token * lengths.sum() + sum(2 * 2 * L * H * n * n for n in lengths)
    return float(total)


def accuracy_check(classifier: Path, work: Path, texts: list[str], labels: list[int]) -> dict:
    """SST-2 dev accuracy of the classifier on every engine: PyTorch eager and fused, ONNX
    Runtime fp32 and int8, and CTranslate2 int8 (its encoder's pooled output through the
    same classifier layer) when installed."""
    import onnxruntime as ort

    from bertforge import BertForSequenceClassification

    model = BertForSequenceClassification.from_pretrained(classifier).eval()
    tok = Tokenizer.from_pretrained(classifier)
    report = export_onnx(str(classifier), str(work / "clf.onnx"), int8=True)
    data = batches(tok, texts, 32, sort=False)

    def predictions(run_batch):
        return np.concatenate([run_batch(b) for b in data]).argmax(-1)

    def torch_logits(m):
        return lambda b: m(**{k: torch.from_numpy(v) for k, v in b.items()}).logits.numpy()

    runs = {"pytorch": torch_logits(model)}
    runs["fused"] = torch_logits(fuse_for_inference(BertForSequenceClassification.from_pretrained(classifier)))
    for name in ("onnx", "int8"):
        session = ort.InferenceSession(report[name], providers=["CPUExecutionProvider"])
        runs["onnx_fp32" if name == "onnx" else "onnx_int8"] = lambda b, s=session: s.run(None, b)[0]
    if importlib.util.find_spec("ctranslate2"):
        backbone = work / "clf-backbone"
        model.bert.save_pretrained(backbone, tokenizer=tok)
        encoder = ctranslate2_encoder(str(backbone), str(work / "clf-ct2"), "int8", torch.get_num_threads())
        weight, bias = model.classifier.weight.detach().numpy(), model.classifier.bias.detach().numpy()

        def ct2(b):
            rows = [ids[m.astype(bool)].tolist() for ids, m in zip(b["input_ids"], b["attention_mask"])]
            return np.asarray(encoder.forward_batch(rows).pooler_output) @ weight.T + bias
        runs["ctranslate2_int8"] = ct2
    gold = np.array(labels)
    with torch.no_grad():
        return {name: float((predictions(run) == gold).mean()) for name, run in runs.items()}


def measure(repeats: int = 5, classifier: str | None = None) -> dict:
    """All of the above; returns the result dict (without saving it)."""
    model_dir = str(minilm_dir())
    texts, labels = sst2()
    tok = Tokenizer.from_pretrained(model_dir)
    work = Path(tempfile.mkdtemp(prefix="bf-inference-"))
    onnx = export_onnx(model_dir, str(work / "minilm.onnx"), int8=True)
    sorted_batches = batches(tok, texts, 32, sort=True)
    file_batches = batches(tok, texts, 32, sort=False)
    singles = batches(tok, texts[:200], 1, sort=False)
    n, threads = len(texts), torch.get_num_threads()
    result = {"machine": machine(), "sentences": n, "batch_size": 32, "repeats": repeats,
              "command": "python -m benchmarks.inference" + (f" --classifier {classifier}" if classifier else "")}

    def engines(int8: bool) -> dict[str, tuple]:
        out = {"onnxruntime_fp32": ("onnxruntime", (onnx["onnx"],))}
        if int8:
            out["onnxruntime_int8"] = ("onnxruntime", (onnx["int8"],))
        if importlib.util.find_spec("openvino"):
            out["openvino_fp32"] = ("openvino", (onnx["onnx"], threads))
        if importlib.util.find_spec("ctranslate2"):
            out["ctranslate2_fp32"] = ("ctranslate2", (model_dir, str(work / "ct2"), "float32", threads))
            if int8:
                out["ctranslate2_int8"] = ("ctranslate2", (model_dir, str(work / "ct2"), "int8", threads))
        return out

    ours = {name: ("bertforge", (model_dir, backend))
            for name, backend in (("bertforge", "torch"), ("bertforge_fused", "fused"), ("bertforge_compiled", "compiled"))}
    # The fused path where no C++ compiler is found: attention in PyTorch ops, not the native kernel.
    ours["bertforge_fused_ops_attention"] = ("bertforge", (model_dir, "fused", False))
    theirs = {f"transformers_{impl}": ("transformers", (model_dir, impl)) for impl in ("eager", "sdpa")}
    timed = timed_apart({**ours, **theirs, **engines(int8=True)}, sorted_batches, repeats, threads)
    sorted_s = {k: v["seconds"] for k, v in timed.items()}
    result["compile_s"] = timed["bertforge_compiled"]["setup_s"]
    result["sorted_sentences_per_s"] = {k: n / v for k, v in sorted_s.items()}
    best_hf = min(sorted_s["transformers_eager"], sorted_s["transformers_sdpa"])
    engine_names = [k for k in ("onnxruntime_fp32", "openvino_fp32", "ctranslate2_fp32") if k in sorted_s]
    best_engine = min(engine_names, key=lambda k: sorted_s[k])
    ours_best = min(ours, key=lambda k: sorted_s[k])
    result["sorted_ratios"] = {
        "bertforge_vs_best_transformers": best_hf / sorted_s["bertforge"],
        "fused_vs_best_transformers": best_hf / sorted_s["bertforge_fused"],
        "compiled_vs_best_transformers": best_hf / sorted_s["bertforge_compiled"],
        "fused_vs_eager": sorted_s["bertforge"] / sorted_s["bertforge_fused"],
        "native_attention_vs_ops_attention": sorted_s["bertforge_fused_ops_attention"] / sorted_s["bertforge_fused"],
        "bertforge_vs_onnxruntime_fp32": sorted_s["onnxruntime_fp32"] / sorted_s["bertforge"],
        "int8_vs_onnxruntime_fp32": sorted_s["onnxruntime_fp32"] / sorted_s["onnxruntime_int8"],
        "best_fp32_engine": best_engine,
        "best_bertforge_fp32": ours_best,
        "bertforge_best_vs_best_engine_fp32": sorted_s[best_engine] / sorted_s[ours_best],
        **{f"{k}_vs_best_fp32": min(sorted_s[best_engine], sorted_s[ours_best]) / sorted_s[k]
           for k in ("onnxruntime_int8", "ctranslate2_int8") if k in sorted_s},
    }

    file_s = {k: v["seconds"] for k, v in timed_apart({
        "pipeline": ("embed", (model_dir, "torch")),
        "pipeline_fused": ("embed", (model_dir, "fused")),
        "pipeline_compiled": ("embed", (model_dir, "compiled")),
    }, texts, repeats, threads).items()}
    file_s.update({k: v["seconds"] for k, v in timed_apart(theirs, file_batches, repeats, threads).items()})
    hf_file_s = min(file_s["transformers_eager"], file_s["transformers_sdpa"])
    result["file_order_sentences_per_s"] = {"bertforge_embed_pipeline": n / file_s["pipeline"],
                                            "bertforge_embed_pipeline_fused": n / file_s["pipeline_fused"],
                                            "bertforge_embed_pipeline_compiled": n / file_s["pipeline_compiled"],
                                            "transformers_eager": n / file_s["transformers_eager"],
                                            "transformers_sdpa": n / file_s["transformers_sdpa"],
                                            "best_transformers": n / hf_file_s,
                                            "ratio": hf_file_s / file_s["pipeline"],
                                            "ratio_fused": hf_file_s / file_s["pipeline_fused"],
                                            "ratio_compiled": hf_file_s / file_s["pipeline_compiled"]}

    single = timed_apart({k: ours[k] for k in ("bertforge", "bertforge_fused", "bertforge_fused_ops_attention")}
                         | engines(int8=False),
                         singles, repeats, threads)
    result["single_sentences_per_s"] = {k: len(singles) / v["seconds"] for k, v in single.items()}

    peak = matmul_peak()
    flops = model_flops(BertConfig.from_json(Path(model_dir) / "config.json"), sorted_batches)
    result["matmul_peak_gflops"] = peak
    result["flops_sorted_pass"] = flops
    result["mfu_sorted"] = {k: flops / v / 1e9 / peak for k, v in sorted_s.items()}
    if classifier:
        result["sst2_accuracy"] = accuracy_check(Path(classifier), work, texts, labels)
    return result
