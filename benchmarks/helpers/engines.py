"""Inference engines side by side, each in its own worker process, their passes interleaved.

Why processes: engines keep thread pools, and in one process they disturb each other. Measured
here (AMD EPYC, 2 cores): once CTranslate2 had run in a process, bertforge's batch-1 pass in the
same process took 1.75x as long, and its batch-32 pass 1.14x, for as long as the process lived;
CTranslate2's bundled OpenMP and torch's share one runtime, which then counts more threads than
cores and stops spinning between parallel regions (the same pass with OMP_WAIT_POLICY=PASSIVE
in a fresh process took as long). A server runs one engine, so each runner gets a process of
its own, set up as it would be served. Passes still take turns in time, so slow drifts of this
shared machine reach every runner alike, and each pass starts after a pause.

    specs = {"bertforge_fused": ("bertforge", (model_dir, "fused")), ...}
    seconds = timed_apart(specs, data, repeats)   # median seconds of a full pass, per runner
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

PAUSE_S = 0.5  # between timed passes, so no pass starts while another engine's threads wind down


def _bertforge(model_dir: str, backend: str, native: bool = True) -> Callable:
    """bertforge's encoder on `backend` (the real `backends.load` path: fused, torch, compiled);
    native=False: the fused path with attention in PyTorch ops, as where no compiler is found."""
    import os

    import torch

    from bertforge import kernels

    if not native:
        os.environ[kernels.SWITCH] = "0"

    from bertforge import BertModel
    from bertforge.inference.backends import load

    model = load(BertModel.from_pretrained(model_dir), backend)

    def run(data):
        with torch.no_grad():
            for b in data:
                model(**{k: torch.from_numpy(v) for k, v in b.items()})
    return run


def _embed(model_dir: str, backend: str) -> Callable:
    """bertforge's `embed` pipeline on texts in file order (it sorts and batches them itself)."""
    from bertforge import BertModel, Tokenizer
    from bertforge.inference.backends import load
    from bertforge.inference.pipelines import embed

    model, tokenizer = load(BertModel.from_pretrained(model_dir), backend), Tokenizer.from_pretrained(model_dir)
    return lambda texts: embed(model, tokenizer, texts, batch_size=32)


def _transformers(model_dir: str, attention: str) -> Callable:
    import torch
    import transformers

    model = transformers.BertModel.from_pretrained(model_dir, attn_implementation=attention).eval()

    def run(data):
        with torch.no_grad():
            for b in data:
                model(**{k: torch.from_numpy(v) for k, v in b.items()})
    return run


def _onnxruntime(path: str) -> Callable:
    import onnxruntime as ort

    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])

    def run(data):
        for b in data:
            session.run(None, b)
    return run


def _openvino(path: str, threads: int) -> Callable:
    import openvino as ov

    # fp32 for real: on CPUs with AVX512-BF16 or AMX, OpenVINO's default precision is bf16.
    compiled = ov.Core().compile_model(path, "CPU", {"INFERENCE_NUM_THREADS": threads,
                                                     "INFERENCE_PRECISION_HINT": "f32"})

    def run(data):
        for b in data:
            compiled(b)
    return run


def ctranslate2_encoder(model_dir: str, out: str, compute_type: str = "float32", threads: int = 0):
    """CTranslate2's encoder, converted from the checkpoint into `out` once."""
    import ctranslate2
    from ctranslate2.converters import TransformersConverter

    if not (Path(out) / "model.bin").is_file():
        TransformersConverter(model_dir).convert(out, force=True)
    return ctranslate2.Encoder(out, device="cpu", compute_type=compute_type, intra_threads=threads)


def _ctranslate2(model_dir: str, out: str, compute_type: str, threads: int) -> Callable:
    """CTranslate2 on the same batches; it takes each row's real ids (no padding)."""
    encoder = ctranslate2_encoder(model_dir, out, compute_type, threads)

    def run(data):
        for b in data:
            rows = [ids[mask.astype(bool)].tolist() for ids, mask in zip(b["input_ids"], b["attention_mask"])]
            np.asarray(encoder.forward_batch(rows).last_hidden_state)
    return run


KINDS = {"bertforge": _bertforge, "embed": _embed, "transformers": _transformers, "onnxruntime": _onnxruntime,
         "openvino": _openvino, "ctranslate2": _ctranslate2}


def _worker(conn, kind: str, args: tuple, data: Any, threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    start = time.perf_counter()
    run = KINDS[kind](*args)
    run(data[:2])  # warm-up; for `compiled`, the one-off compilation
    conn.send(time.perf_counter() - start)
    while conn.recv():
        start = time.perf_counter()
        run(data)
        conn.send(time.perf_counter() - start)


def timed_apart(specs: dict[str, tuple[str, tuple]], data: Any, repeats: int, threads: int) -> dict[str, dict]:
    """{name: (kind, args)} -> {name: {"seconds": median pass, "setup_s": build + warm-up}}.

    Workers start one after another (so set-up times are not shared), then the passes take
    turns: round r starts at the r-th runner, a pause before each pass.
    """
    ctx = mp.get_context("spawn")
    workers, setup = {}, {}
    try:
        for name, (kind, args) in specs.items():
            parent, child = ctx.Pipe()
            process = ctx.Process(target=_worker, args=(child, kind, args, data, threads), daemon=True)
            process.start()
            workers[name] = (parent, process)
            setup[name] = parent.recv()
        times: dict[str, list[float]] = {name: [] for name in specs}
        names = list(specs)
        for r in range(repeats):
            for name in names[r % len(names):] + names[:r % len(names)]:
                time.sleep(PAUSE_S)
                workers[name][0].send(True)
                times[name].append(workers[name][0].recv())
    finally:
        for parent, process in workers.values():
            if process.is_alive():
                parent.send(False)
                process.join(timeout=30)
    return {name: {"seconds": statistics.median(t), "setup_s": setup[name]} for name, t in times.items()}
