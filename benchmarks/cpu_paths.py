"""CPU choices, measured: thread counts, the compiled encoder, and int8 quantisation settings.

The speed issue asks to try these and keep what measures faster; this script is the record.
All runs use all-MiniLM-L6-v2 on SST-2 dev (872 sentences) in identical length-sorted
batches of 32, medians of --repeats passes.

1. torch threads 1, 2 and 4 (this machine has 2 cores) for the eager encoder.
2. The eager encoder against `compile_for_inference` (Inductor, dynamic shapes, frozen weights).
3. With --classifier DIR (an SST-2 fine-tuned checkpoint): ONNX Runtime dynamic int8 with one
   weight scale per tensor, per output channel, and MatMul-only variants: accuracy and speed.

    python -m benchmarks.cpu_paths [--classifier DIR] [--repeats 3]
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bertforge import BertModel, Tokenizer
from bertforge.export import export_onnx
from bertforge.pipelines import compile_for_inference

from .common import inference_args, machine, minilm_dir, save
from .inference import batches, ort_runner, sst2, timed, torch_runner

INT8_VARIANTS = {
    "per_tensor": {},
    "per_tensor_matmul_only": {"op_types_to_quantize": ["MatMul"]},
    "per_channel": {"per_channel": True},
    "per_channel_matmul_only": {"per_channel": True, "op_types_to_quantize": ["MatMul"]},
}


def int8_variants(classifier: Path, texts: list[str], labels: list[int], repeats: int) -> dict:
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    work = Path(tempfile.mkdtemp(prefix="bf-int8-"))
    fp32 = Path(export_onnx(str(classifier), str(work / "clf.onnx"))["onnx"])
    tok = Tokenizer.from_pretrained(classifier)
    file_order, by_length = batches(tok, texts, 32, sort=False), batches(tok, texts, 32, sort=True)
    logging.getLogger().setLevel(logging.ERROR)
    out = {}
    for name, kwargs in {"fp32": None, **INT8_VARIANTS}.items():
        path = fp32
        if kwargs is not None:
            path = work / f"{name}.onnx"
            quantize_dynamic(str(fp32), str(path), weight_type=QuantType.QInt8, **kwargs)
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        predicted = np.concatenate([session.run(None, b)[0] for b in file_order]).argmax(-1)
        out[name] = {"accuracy": float((predicted == np.array(labels)).mean()),
                     "sentences_per_s": len(texts) / timed(ort_runner(path), by_length, repeats)}
        print(name, out[name], flush=True)
    return out


def main() -> None:
    args = inference_args("for the int8 variants")
    texts, labels = sst2()
    tok = Tokenizer.from_pretrained(minilm_dir())
    data = batches(tok, texts, 32, sort=True)
    result = {"machine": machine(), "command": "python -m benchmarks.cpu_paths" + (" --classifier DIR" if args.classifier else "")}
    model = BertModel.from_pretrained(minilm_dir()).eval()
    default_threads = torch.get_num_threads()
    threads = {}
    for n in (1, 2, 4):
        torch.set_num_threads(n)
        threads[n] = len(texts) / timed(torch_runner(model), data, args.repeats)
        print("threads", n, threads[n], flush=True)
    torch.set_num_threads(default_threads)
    result["threads_sentences_per_s"] = threads
    eager = len(texts) / timed(torch_runner(model), data, args.repeats)
    compiled = compile_for_inference(BertModel.from_pretrained(minilm_dir()))
    start = time.perf_counter()
    torch_runner(compiled)(data[::4])  # compile once, for the dynamic shapes
    compile_s = time.perf_counter() - start
    result["compile"] = {"eager": eager, "compiled": len(texts) / timed(torch_runner(compiled), data, args.repeats),
                         "compile_s": compile_s}
    result["compile"]["ratio"] = result["compile"]["compiled"] / eager
    print("compile", result["compile"], flush=True)
    if args.classifier:
        result["int8"] = int8_variants(Path(args.classifier), texts, labels, args.repeats)
    print(json.dumps(result, indent=2))
    print("saved", save("cpu_paths", result))


if __name__ == "__main__":
    main()
