"""`bertforge export onnx`: the model as an ONNX graph with dynamic batch and sequence axes.

The export is checked before it is reported done: ONNX Runtime runs it on padded batches
of shapes no export traced, with rows of 23 tokens and of 520 (or the model's length), and its
outputs must match PyTorch's within 1e-4 at both: a graph right on short rows and wrong on long
ones (a length-dependent mask frozen at the traced length) is never written. `--int8` adds a
dynamically quantised copy (int8 weights for the Linear layers, for CPU inference) next to it,
checked at the same two lengths.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from ..errors import BertforgeError, require
from ..interop.hf import head_of
from ..interop.sentence_dir import SentencePipeline, read_sentence_dir
from ..jsonfile import dumps
from ..models.registry import HEADS
from ..safefiles import fsync_path, fsync_tree, refusing_writes
from ..tokenization.kinds import load_tokenizer


class _Outputs(torch.nn.Module):
    """Wraps a bertforge model so that it takes and returns plain tensors, as ONNX needs."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, token_type_ids, attention_mask):
        out = self.model(input_ids, token_type_ids, attention_mask)
        if hasattr(out, "start_logits") and out.start_logits is not None:
            return out.start_logits, out.end_logits
        if hasattr(out, "last_hidden_state"):
            return (out.last_hidden_state,) + ((out.pooler_output,) if out.pooler_output is not None else ())
        return (out.logits,)


class _SentenceOutputs(torch.nn.Module):
    """The encoder followed by a sentence-transformers directory's Pooling, Dense and Normalize modules:
    `token_embeddings` float [B, T, H] and `sentence_embedding` float [B, D], the two outputs
    `SentenceTransformer` itself names, so the graph gives what `encode` gives."""

    def __init__(self, backbone: torch.nn.Module, sentence: SentencePipeline) -> None:
        super().__init__()
        self.backbone, self.sentence = backbone, sentence

    def forward(self, input_ids, token_type_ids, attention_mask):
        hidden = self.backbone(input_ids, token_type_ids, attention_mask).last_hidden_state
        return hidden, self.sentence(hidden, attention_mask)


SENTENCE_OUTPUTS = ["token_embeddings", "sentence_embedding"]


def _names(model) -> list[str]:
    names = list(HEADS[model.hf_architecture].outputs)
    if getattr(model, "pooler", "absent") is None and "pooler_output" in names:  # BERT built without its pooler
        names.remove("pooler_output")  # (ELECTRA's and DeBERTa's backbones never list one)
    return names


def _sample(vocab: int, batch: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[-1, length // 2:] = 0  # one padded row
    return {"input_ids": ids.masked_fill(mask == 0, 0), "token_type_ids": torch.zeros_like(ids), "attention_mask": mask}


@contextlib.contextmanager
def _quiet(*loggers: str):
    """Raise these loggers to ERROR for a while: library notes that are not the user's concern."""
    saved = [(logging.getLogger(name), logging.getLogger(name).level) for name in loggers]
    for logger, _ in saved:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in saved:
            logger.setLevel(level)


def export_onnx(model_dir: str, out: str, int8: bool = False, opset: int = 18, overwrite: bool = False) -> dict:
    """Export a checkpoint directory, check it against PyTorch with ONNX Runtime, and optionally
    quantise it. Returns a report (also written next to the graph as OUT.json)."""
    out_path = Path(out)
    existed = out_path.exists()
    if existed and not overwrite:
        raise BertforgeError(f"{out_path}: already exists; pass --overwrite to replace it or choose another --out")
    # The tokenizer is written beside the graph; files of that name that are there already are someone's.
    taken = [p.name for p in map(out_path.parent.joinpath, TOKENIZER_FILES) if p.exists()
             and (Path(model_dir) / p.name).is_file()]
    if taken and not overwrite:
        raise BertforgeError(f"{out_path.parent}: already holds {', '.join(taken)}, which the export writes beside the "
                             "graph; pass --overwrite to replace them or choose an --out in another folder")
    model = head_of(model_dir).cls.from_pretrained(model_dir).eval()
    sentence = read_sentence_dir(model_dir, model.config.hidden_size)
    if sentence is not None and sentence.pooling == ("pooler",):
        raise BertforgeError(f"{model_dir}: pooling by the backbone's pooler is not exported; use a token pooling mode")
    # A checkpoint saved without its tokenizer exports without one.
    has_tokenizer = any((Path(model_dir) / name).is_file() for name in TOKENIZER_FILES)
    tokenizer = load_tokenizer(model_dir) if has_tokenizer else None
    if sentence is not None and tokenizer is not None:  # its preprocessing travels in the tokenizer beside the graph
        tokenizer = tokenizer.lowercased() if sentence.lowercase else tokenizer
        if sentence.max_length:
            tokenizer.model_max_length = min(sentence.max_length, model.config.max_sequence_length)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    # Everything is written into a hidden folder beside the target, checked, flushed, and only then renamed
    # into place: a full or read-only disk, or a failed check, leaves the previous export as it was.
    kept = f"the previous {out_path.name} is intact" if existed else "nothing was written there"
    folders: list[Path] = []  # the staging folder, once made
    with refusing_writes(str(out_path), out_path.parent, lambda: kept,
                         cleanup=lambda: [shutil.rmtree(f, ignore_errors=True) for f in folders]):
        folders.append(Path(tempfile.mkdtemp(dir=out_path.parent, prefix=f".{out_path.name}.")))
        staging = folders[0]
        report = export_model(model, staging / out_path.name, int8=int8, opset=opset, sentence=sentence)
        report["onnx"] = str(out_path)
        if int8:
            report["int8"] = str(_int8_path(out_path))
        if sentence is not None:
            report["sentence_transformers"] = {"pooling": list(sentence.pooling), "normalize": sentence.normalize,
                                               "dense_layers": sum(k == "dense" for k, _ in sentence.steps),
                                               "max_length": sentence.max_length, "lowercase": sentence.lowercase,
                                               "prompt": sentence.prompt,  # to put in front of each text yourself
                                               "similarity": sentence.similarity}
        (staging / "tokenizer").mkdir()
        if tokenizer is not None:
            tokenizer.save(staging / "tokenizer")
        report["tokenizer"] = sorted(p.name for p in (staging / "tokenizer").iterdir())
        (staging / out_path.with_suffix(".json").name).write_text(dumps(report, indent=2) + "\n", encoding="utf-8")
        fsync_tree(staging)
    # The graphs and the tokenizer first, the report that names them last.
    for name in report["tokenizer"]:
        os.replace(staging / "tokenizer" / name, out_path.parent / name)
    for target in (out_path, _int8_path(out_path) if int8 else None, out_path.with_suffix(".json")):
        if target is not None:
            os.replace(staging / target.name, target)
    if not int8 and _int8_path(out_path).is_file():
        _int8_path(out_path).unlink()  # the replaced export's int8 copy: its report is gone, and it is not this model's
    fsync_path(out_path.parent)
    shutil.rmtree(staging, ignore_errors=True)
    return report


TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "spiece.model", "sentencepiece.bpe.model")
"""What a saved tokenizer may consist of (by kind), and so what an export may write beside its graph."""


def _int8_path(out_path: Path) -> Path:
    return out_path.with_name(out_path.stem + ".int8.onnx")


def check_lengths(config) -> list[int]:
    """The row lengths an export is checked at: a short one (23 tokens, below any local window) and a long one,
    520 tokens or the model's length if shorter: several of ModernBERT-base's 128-token windows, past
    DeBERTa-v3's 256 position buckets, and up to RoBERTa's offset positions. Whatever depends on the length
    (a band mask, relative distances, position ids) is then seen on both sides of where it changes."""
    return sorted({min(23, config.max_sequence_length), min(520, config.max_sequence_length)})


def difference_from_torch(model: torch.nn.Module, run: Callable[[dict[str, np.ndarray]], list],
                          module: torch.nn.Module | None = None, length: int = 23) -> float:
    """Largest absolute difference between `run` (an engine on int64 input_ids, token_type_ids and
    attention_mask arrays -> the model's outputs in `_names` order) and PyTorch, on a padded batch of
    rows `length` tokens long (3 rows, 2 past 100 tokens), of a shape no export traced; padding positions of
    per-token outputs are left out."""
    check = _sample(model.config.vocab_size, 3 if length <= 100 else 2, length, 1)
    with torch.no_grad():
        reference = [t.numpy() for t in (module or _Outputs(model.eval()))(*check.values())]
    got = run({k: v.numpy() for k, v in check.items()})
    real = check["attention_mask"].numpy().astype(bool)
    return max(float(np.abs((np.asarray(g) - r)[real] if r.shape[:2] == real.shape else np.asarray(g) - r).max())
               for g, r in zip(got, reference))


def export_model(model: torch.nn.Module, out_path: Path, int8: bool = False, opset: int = 18,
                 sentence: SentencePipeline | None = None) -> dict:
    """Export `model` (a bertforge backbone or head) to `out_path`, checked against PyTorch within
    1e-4 on padded batches of shapes the export never saw, at each of `check_lengths`; with `int8`, also
    OUT.int8.onnx. With
    `sentence` (a sentence-transformers directory's modules), the graph ends in its sentence embedding."""
    require("export", "onnx", "onnxruntime", "onnxscript", what="ONNX export")
    import onnxruntime as ort

    model = model.eval()
    module = _SentenceOutputs(getattr(model, "backbone", model), sentence) if sentence else _Outputs(model)
    names = SENTENCE_OUTPUTS if sentence else _names(model)
    sample = _sample(model.config.vocab_size, 2, 16, 0)
    axes = {"batch": torch.export.Dim("batch", min=1, max=1024),
            "seq": torch.export.Dim("seq", min=2, max=model.config.max_sequence_length)}
    shapes = {k: {0: axes["batch"], 1: axes["seq"]} for k in sample}
    out_path.parent.mkdir(parents=True, exist_ok=True)
    # The exporter's notes on axis naming, and on torchvision operators it skips, are not the user's concern.
    with warnings.catch_warnings(), _quiet("torch.onnx._internal.exporter._registration"):
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (sample["input_ids"], sample["token_type_ids"], sample["attention_mask"]),
                          str(out_path), input_names=list(sample), output_names=names, dynamic_shapes=shapes,
                          opset_version=opset, dynamo=True, external_data=False, verbose=False)

    report = {"onnx": str(out_path), "architecture": model.hf_architecture, "outputs": names}
    files = [("fp32", out_path)]
    if int8:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        int8_path = _int8_path(out_path)
        # Per-output-channel weight scales: with one scale per tensor, SST-2 accuracy of a
        # fine-tuned MiniLM fell 1.95 points; per channel, 0.46 (benchmarks/inference.py).
        with _quiet(""):  # onnxruntime's pre-processing hint goes to the root logger
            quantize_dynamic(str(out_path), str(int8_path), weight_type=QuantType.QInt8, per_channel=True)
        files.append(("int8", int8_path))
        report["int8"] = str(int8_path)
    lengths = check_lengths(model.config)
    report["checked_lengths"] = lengths
    for kind, path in files:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        by_length = {n: difference_from_torch(model, lambda feeds: session.run(None, feeds), module, n)
                     for n in lengths}
        report[f"max_abs_diff_{kind}"] = max(by_length.values())
        report[f"max_abs_diff_{kind}_by_length"] = {str(n): d for n, d in by_length.items()}
        if kind == "fp32":
            worst = max(by_length, key=by_length.get)
            if by_length[worst] > 1e-4:
                for _, written in files:
                    written.unlink(missing_ok=True)
                raise BertforgeError(f"ONNX Runtime differs from PyTorch by {by_length[worst]:.2e} on rows of {worst} "
                                     f"tokens (> 1e-4; checked at {' and '.join(map(str, lengths))}); export removed")
        elif by_length[lengths[-1]] > INT8_GROWTH * by_length[lengths[0]] + INT8_SLACK:
            # Quantisation changes the weights, not what depends on the length: its error on long rows stays
            # near its error on short ones (measured in docs/results.md), unless the graph itself is wrong there.
            for _, written in files:
                written.unlink(missing_ok=True)
            raise BertforgeError(f"the int8 graph differs from PyTorch by {by_length[lengths[-1]]:.2e} on rows of "
                                 f"{lengths[-1]} tokens against {by_length[lengths[0]]:.2e} on rows of {lengths[0]}: "
                                 "more than quantisation explains; export removed")
    return report


INT8_GROWTH, INT8_SLACK = 3.0, 0.02  # the long rows' int8 error may be 3x the short rows' plus 0.02, no more


# Raised when the graph exported for the same weights changes (a release's version does not move with every commit, and
# a cached graph of the old form would still pass the accuracy check): 2 = attention as an additive-mask softmax.
GRAPH_FORMAT = 2


def weights_key(model: torch.nn.Module) -> str:
    """A hash of everything an export depends on: the architecture, config, every tensor of the state dict (names,
    dtypes, shapes, bytes), the torch, onnx and bertforge versions and GRAPH_FORMAT."""
    import hashlib
    import json

    import onnx

    from .. import __version__

    h = hashlib.sha256()
    h.update(f"{model.hf_architecture}|{json.dumps(model.config.to_dict(), sort_keys=True, default=str)}|"
             f"torch {torch.__version__}|onnx {onnx.__version__}|bertforge {__version__}|graph {GRAPH_FORMAT}".encode())
    for name, tensor in model.state_dict().items():
        t = tensor.detach().contiguous().cpu()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:32]


def cached_export(model: torch.nn.Module) -> dict:
    """`export_model`'s report for `model`, exported once per set of weights into $BERTFORGE_CACHE_DIR/onnx/ (named by
    `weights_key`) and read from there afterwards. A cached graph is checked against PyTorch as a new export is
    (within 1e-4 at `check_lengths`); one that fails is exported again."""
    require("export", "onnx", "onnxruntime", "onnxscript", what="ONNX export")
    import onnxruntime as ort

    from .. import machine_cache

    folder = machine_cache.root() / "onnx"
    path = folder / f"{model.hf_architecture}-{weights_key(model)}.onnx"
    if path.is_file():
        try:
            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            worst = max(difference_from_torch(model.eval(), lambda feeds: session.run(None, feeds), length=n)
                        for n in check_lengths(model.config))
        except Exception:  # noqa: BLE001  a damaged file (cut short, overwritten): export again
            worst = float("inf")
        if worst <= 1e-4:
            return {"onnx": str(path), "max_abs_diff_fp32": worst, "cached": True}
        path.unlink(missing_ok=True)  # damaged or not this model's: export again
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f".{path.stem}.{os.getpid()}.onnx"  # a killed export never leaves a file under the real name
    try:
        report = export_model(model, partial)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return {**report, "onnx": str(path), "cached": False}
