"""CPU inference, side by side on SST-2 dev (872 sentences) with all-MiniLM-L6-v2, batch 32.

1. Identical batches sorted by length: bertforge `BertModel` vs transformers `BertModel`
   (eager and sdpa attention) vs ONNX Runtime (fp32 and dynamic int8) on bertforge's export,
   vs OpenVINO (on the same ONNX graph) and CTranslate2 (converted from the checkpoint), when
   those are installed (`pip install openvino ctranslate2`).
2. File order: bertforge's `embed` pipeline (it buckets by length itself) vs transformers
   (the better of eager and sdpa) on batches of 32 in file order.
   Both 1 and 2 also run bertforge's encoder compiled for inference (`compile_for_inference`:
   TorchInductor, dynamic shapes, frozen weights); its one-off compile time is reported.
3. Model FLOPs utilisation against a 2048^3 fp32 matmul measured in the same run, counting
   only real tokens.
4. With --classifier DIR (an SST-2 fine-tuned checkpoint), SST-2 dev accuracy of PyTorch,
   ONNX Runtime fp32 and int8, so the int8 accuracy change is measured, not assumed.

Every figure is the median of --repeats full passes over the 872 sentences.

    python -m benchmarks.inference [--repeats 3] [--classifier runs/sst2]
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import transformers

from bertforge import BertModel, Tokenizer
from bertforge.export import export_onnx
from bertforge.pipelines import compile_for_inference, embed

from .common import DATA, inference_args, machine, median, minilm_dir, need, save


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


def timed(run, data, repeats: int) -> float:
    """Median seconds of a full pass over `data`."""
    run(data[:1])  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run(data)
        times.append(time.perf_counter() - start)
    return median(times)


def torch_runner(model):
    def run(data):
        with torch.no_grad():
            for b in data:
                model(**{k: torch.from_numpy(v) for k, v in b.items()})
    return run


def ort_runner(path: Path):
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def run(data):
        for b in data:
            session.run(None, b)
    return run


def openvino_runner(path: Path):
    import openvino as ov

    compiled = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_NUM_THREADS": torch.get_num_threads()})

    def run(data):
        for b in data:
            compiled(b)
    return run


def ctranslate2_runner(model_dir: Path, work: Path):
    """CTranslate2's encoder on the same batches; it takes each row's real ids (no padding)."""
    import ctranslate2
    from ctranslate2.converters import TransformersConverter

    out = work / "ct2"
    TransformersConverter(str(model_dir)).convert(str(out))
    encoder = ctranslate2.Encoder(str(out), device="cpu", compute_type="float32",
                                  intra_threads=torch.get_num_threads())
    rows = lambda b: [ids[mask.astype(bool)].tolist() for ids, mask in zip(b["input_ids"], b["attention_mask"])]  # noqa: E731

    def run(data):
        for b in data:
            np.asarray(encoder.forward_batch(rows(b)).last_hidden_state)
    return run


def optional_engines(model_dir: Path, onnx_path: Path, work: Path, data) -> dict[str, tuple]:
    """OpenVINO and CTranslate2 runners, for those that are installed."""
    import importlib.util

    engines = {}
    if importlib.util.find_spec("openvino"):
        engines["openvino_fp32"] = (openvino_runner(onnx_path), data)
    if importlib.util.find_spec("ctranslate2"):
        engines["ctranslate2_fp32"] = (ctranslate2_runner(model_dir, work), data)
    return engines


def timed_together(runs: dict[str, tuple], repeats: int) -> dict[str, float]:
    """Median seconds per runner, {name: (run, data)}, taking turns pass by pass.

    On a shared machine the speed drifts over minutes; interleaving the runners exposes
    them to the same drift instead of giving one a quiet minute and another a busy one.
    """
    for run, data in runs.values():
        run(data[:1])  # warm-up
    times: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(repeats):
        names = list(runs)
        for name in names[r % len(names):] + names[:r % len(names)]:
            run, data = runs[name]
            start = time.perf_counter()
            run(data)
            times[name].append(time.perf_counter() - start)
    return {name: median(t) for name, t in times.items()}


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
    from bertforge import BertForSequenceClassification

    model = BertForSequenceClassification.from_pretrained(classifier).eval()
    tok = Tokenizer.from_pretrained(classifier)
    report = export_onnx(str(classifier), str(work / "clf.onnx"), int8=True)
    data = batches(tok, texts, 32, sort=False)
    import onnxruntime as ort

    def predictions(run_batch):
        return np.concatenate([run_batch(b) for b in data]).argmax(-1)

    with torch.no_grad():
        pt = predictions(lambda b: model(**{k: torch.from_numpy(v) for k, v in b.items()}).logits.numpy())
    fp32 = ort.InferenceSession(report["onnx"], providers=["CPUExecutionProvider"])
    int8 = ort.InferenceSession(report["int8"], providers=["CPUExecutionProvider"])
    acc = lambda p: float((p == np.array(labels)).mean())  # noqa: E731
    return {"pytorch": acc(pt), "onnx_fp32": acc(predictions(lambda b: fp32.run(None, b)[0])),
            "onnx_int8": acc(predictions(lambda b: int8.run(None, b)[0]))}


def measure(repeats: int = 3, classifier: str | None = None) -> dict:
    """All of the above in one process; returns the result dict (without saving it)."""
    model_dir = minilm_dir()
    texts, labels = sst2()
    tok = Tokenizer.from_pretrained(model_dir)
    work = Path(tempfile.mkdtemp(prefix="bf-inference-"))
    onnx = export_onnx(str(model_dir), str(work / "minilm.onnx"), int8=True)
    sorted_batches = batches(tok, texts, 32, sort=True)
    file_batches = batches(tok, texts, 32, sort=False)
    n = len(texts)
    ours = BertModel.from_pretrained(model_dir).eval()
    hf = {impl: transformers.BertModel.from_pretrained(model_dir, attn_implementation=impl).eval()
          for impl in ("eager", "sdpa")}
    result = {"machine": machine(), "sentences": n, "batch_size": 32, "repeats": repeats,
              "command": "python -m benchmarks.inference" + (f" --classifier {classifier}" if classifier else "")}
    compiled = compile_for_inference(BertModel.from_pretrained(model_dir))
    start = time.perf_counter()
    embed(compiled, tok, texts[:64], batch_size=32)  # one dynamic-shape compilation serves every batch after
    result["compile_s"] = time.perf_counter() - start
    sorted_s = timed_together({
        "bertforge": (torch_runner(ours), sorted_batches),
        "bertforge_compiled": (torch_runner(compiled), sorted_batches),
        "transformers_eager": (torch_runner(hf["eager"]), sorted_batches),
        "transformers_sdpa": (torch_runner(hf["sdpa"]), sorted_batches),
        "onnxruntime_fp32": (ort_runner(Path(onnx["onnx"])), sorted_batches),
        "onnxruntime_int8": (ort_runner(Path(onnx["int8"])), sorted_batches),
        **optional_engines(Path(model_dir), Path(onnx["onnx"]), work, sorted_batches),
    }, repeats)
    result["sorted_sentences_per_s"] = {k: n / v for k, v in sorted_s.items()}
    best_hf = max(result["sorted_sentences_per_s"]["transformers_eager"], result["sorted_sentences_per_s"]["transformers_sdpa"])
    result["sorted_ratios"] = {
        "bertforge_vs_best_transformers": result["sorted_sentences_per_s"]["bertforge"] / best_hf,
        "bertforge_vs_onnxruntime_fp32": sorted_s["onnxruntime_fp32"] / sorted_s["bertforge"],
        "int8_vs_onnxruntime_fp32": sorted_s["onnxruntime_fp32"] / sorted_s["onnxruntime_int8"],
        "compiled_vs_best_transformers": result["sorted_sentences_per_s"]["bertforge_compiled"] / best_hf,
        "compiled_vs_onnxruntime_fp32": sorted_s["onnxruntime_fp32"] / sorted_s["bertforge_compiled"],
    }
    engines = [k for k in ("onnxruntime_fp32", "openvino_fp32", "ctranslate2_fp32") if k in sorted_s]
    best_engine = min(engines, key=lambda k: sorted_s[k])
    ours_best = min(("bertforge", "bertforge_compiled"), key=lambda k: sorted_s[k])
    result["sorted_ratios"].update({
        "best_fp32_engine": best_engine,
        "best_bertforge_fp32": ours_best,
        "bertforge_best_vs_best_engine_fp32": sorted_s[best_engine] / sorted_s[ours_best],
        "int8_vs_best_engine_fp32": sorted_s[best_engine] / sorted_s["onnxruntime_int8"],
    })
    file_s = timed_together({
        "pipeline": (lambda data: embed(ours, tok, data, batch_size=32), texts),
        "pipeline_compiled": (lambda data: embed(compiled, tok, data, batch_size=32), texts),
        "transformers_eager": (torch_runner(hf["eager"]), file_batches),
        "transformers_sdpa": (torch_runner(hf["sdpa"]), file_batches),
    }, repeats)
    pipeline_s, compiled_pipeline_s = file_s["pipeline"], file_s["pipeline_compiled"]
    hf_file_s = min(file_s["transformers_eager"], file_s["transformers_sdpa"])
    result["file_order_sentences_per_s"] = {"bertforge_embed_pipeline": n / pipeline_s,
                                            "bertforge_embed_pipeline_compiled": n / compiled_pipeline_s,
                                            "transformers_eager": n / file_s["transformers_eager"],
                                            "transformers_sdpa": n / file_s["transformers_sdpa"],
                                            "best_transformers": n / hf_file_s,
                                            "ratio": hf_file_s / pipeline_s,
                                            "ratio_compiled": hf_file_s / compiled_pipeline_s}
    peak = matmul_peak()
    flops = model_flops(ours.config, sorted_batches)
    result["matmul_peak_gflops"] = peak
    result["flops_sorted_pass"] = flops
    result["mfu_sorted"] = {k: flops / v / 1e9 / peak for k, v in sorted_s.items()}
    if classifier:
        result["sst2_accuracy"] = accuracy_check(Path(classifier), work, texts, labels)
    return result


def main() -> None:
    args = inference_args("for the int8 accuracy change")
    result = measure(args.repeats, args.classifier)
    print(json.dumps(result, indent=2))
    print("saved", save("inference", result))


if __name__ == "__main__":
    main()
