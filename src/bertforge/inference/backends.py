"""Inference backends: the same model run by PyTorch, oneDNN's fused kernels, the compiled
encoder, ONNX Runtime or JAX.

- `auto` (the default): the fastest of these this machine has at the shapes served, measured once
  per machine and model shape (`routed.py`): `fused` or `torch` for batches, and in a server ONNX
  Runtime for one-row requests where it is faster there;
- `torch`: eager PyTorch, the encoder exactly as `models/bert.py` reads;
- `fused`: the same modules with oneDNN doing more per call (`fused.py`: one QKV matmul,
  pre-packed weights, GELU and residual adds fused into the matmuls, unpadding kept, attention
  in a native kernel compiled once per machine); equal to `torch` up to summation order
  (tested within 1e-4), and the fastest fp32 path measured here at batches of 32, level with
  OpenVINO (docs/serving.md), so `auto` picks it for batches where this torch build has oneDNN;
- `fused-bf16`: the fused path under CPU autocast to bfloat16: the matmuls in bf16 on weights
  packed in bf16 once, the residual stream, LayerNorms and attention's arithmetic in float32;
  outputs handed back as float32. Not the fp32 numbers: its closeness is measured (docs/results.md);
  for CPUs that multiply bf16 natively (AMX, AVX512-BF16), where it is the fastest path measured;
- `compiled`: the encoder through TorchInductor with frozen weights (`compile_for_inference`);
  a one-off compile of ~20 s;
- `onnx`: the model exported to ONNX at start-up and run by ONNX Runtime; the export is checked
  against PyTorch within 1e-4 before it is used;
- `openvino`: OpenVINO (fp32) on the same checked export, itself checked within 1e-4; the
  fastest fp32 engine measured on an AVX-512 host (docs/serving.md);
- `onnx-int8`: the same graph with dynamically quantised int8 weights (per output channel); its
  accuracy change is measured, not assumed (about -0.5 points on SST-2, docs/results.md);
- `jax`: the Flax NNX model (`bertforge.jax`), jit-compiled per padded width (a multiple of 32
  tokens, so a few shapes compile once each); for the heads JAX has (encoder, masked-LM,
  pretraining, sequence classification).

`load(model, backend)` returns something the pipelines call exactly as they call a model:
`model(input_ids=..., token_type_ids=..., attention_mask=...)` gives an object with the head's
outputs by name, and everything else (`config`, `problem_type()`, the device) comes from the
PyTorch model it wraps.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from ..constants import INFERENCE_BACKENDS
from ..errors import InputError

BACKENDS = INFERENCE_BACKENDS
DEFAULT = BACKENDS[0]
log = logging.getLogger("bertforge")


def _workdir() -> Path:
    """A private folder for this process's exports, removed at exit: nothing is written into the
    user's checkpoint directory."""
    path = Path(tempfile.mkdtemp(prefix="bertforge-onnx-"))
    atexit.register(shutil.rmtree, path, True)
    return path


class ForeignModel:
    """A bertforge model whose forward pass another engine runs. The pipelines call it as the torch
    model and get torch tensors back; every other attribute (`config`, `problem_type()`, the
    device) falls through to the torch model. `.backbone`, which the embedding and fill-mask
    pipelines use, is the backbone run by the same engine, made on first use."""

    engine = "this backend"

    def __init__(self, model: torch.nn.Module) -> None:
        self._model = model.eval()
        self._backbone: ForeignModel | None = None

    def _backbone_of(self) -> "ForeignModel":
        raise NotImplementedError

    def _run(self, arrays: dict[str, Any]) -> dict[str, Any]:
        """input_ids, token_type_ids, attention_mask: int64 numpy [B, T] -> outputs by name (numpy)."""
        raise NotImplementedError

    def __getattr__(self, name: str) -> Any:
        if name == "backbone" and hasattr(self._model, "backbone"):
            if self._backbone is None:
                self._backbone = self._backbone_of()
            return self._backbone
        return getattr(self._model, name)

    def eval(self) -> "ForeignModel":
        return self

    def __call__(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None, **unused: Any) -> SimpleNamespace:
        """input_ids, token_type_ids, attention_mask: long [B, T] -> the head's outputs by name."""
        if unused.get("position_ids") is not None or unused.get("output_attentions"):
            raise InputError(f"{self.engine} takes padded batches only (no packed rows, no attention maps)")
        arrays = {"input_ids": input_ids.cpu().numpy(),
                  "token_type_ids": (token_type_ids if token_type_ids is not None
                                     else torch.zeros_like(input_ids)).cpu().numpy(),
                  "attention_mask": (attention_mask if attention_mask is not None
                                     else torch.ones_like(input_ids)).cpu().numpy()}
        named: dict[str, Any] = {"hidden_states": None, "attentions": None, "pooler_output": None}
        for k, v in self._run(arrays).items():
            if v is not None:
                v = np.asarray(v)  # torch needs writable memory; some engines hand out read-only views
                named[k] = torch.from_numpy(v if v.flags.writeable else v.copy())
        return SimpleNamespace(**named)


class OnnxModel(ForeignModel):
    """ONNX Runtime on the model exported (and checked within 1e-4) at start-up."""

    engine = "the ONNX backends"

    def __init__(self, model: torch.nn.Module, int8: bool, workdir: Path | None = None, cached: bool = False) -> None:
        """cached: the fp32 graph from $BERTFORGE_CACHE_DIR/onnx (exported there once per set of weights,
        `export.cached_export`) instead of a private folder removed at exit."""
        import onnxruntime as ort

        from .export import _names, cached_export, export_model

        super().__init__(model)
        self._int8 = int8
        if cached and not int8:
            self._workdir = workdir
            report = cached_export(model)
        else:
            self._workdir = workdir or _workdir()
            report = export_model(model, self._workdir / f"{model.hf_architecture}.onnx", int8=int8)
        kind = "int8" if int8 else "fp32"
        log.info("%s exported to ONNX; ONNX Runtime (%s) differs from PyTorch by at most %.2e on a check batch",
                 model.hf_architecture, kind, report[f"max_abs_diff_{kind}"])
        self.check_difference = report[f"max_abs_diff_{kind}"]
        options = ort.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        # ONNX Runtime's threads spin while a run lasts (its default), and stop when it returns, instead of spinning on
        # between requests against the server's own threads for the same cores: 5 alternated rounds of 400 sequential
        # one-sentence requests on 2 cores gave p99 10.5 against 15.9 ms, p50 7.2 against 6.4 (the same by the
        # rounds' spread; docs/results.md).
        options.add_session_config_entry("session.force_spinning_stop", "1")
        self._graph = report["int8"] if int8 else report["onnx"]
        self._session = ort.InferenceSession(self._graph, options, providers=["CPUExecutionProvider"])
        self._names = _names(model)

    def _backbone_of(self) -> "OnnxModel":
        return OnnxModel(self._model.backbone, self._int8, self._workdir, cached=self._workdir is None)

    def _run(self, arrays: dict[str, Any]) -> dict[str, Any]:
        return dict(zip(self._names, self._session.run(None, arrays)))


class OpenVinoModel(OnnxModel):
    """OpenVINO on the same checked export, in fp32 (on CPUs with bf16 support its default
    precision is bf16, which would change the answers), itself checked against PyTorch."""

    engine = "--backend openvino"

    def __init__(self, model: torch.nn.Module, workdir: Path | None = None) -> None:
        import openvino as ov

        from .export import check_lengths, difference_from_torch

        super().__init__(model, int8=False, workdir=workdir)
        self._compiled = ov.Core().compile_model(self._graph, "CPU", {
            "INFERENCE_NUM_THREADS": torch.get_num_threads(), "INFERENCE_PRECISION_HINT": "f32"})
        self.check_difference = max(difference_from_torch(model, lambda feeds: self._compiled(feeds).to_tuple(),
                                                          length=n) for n in check_lengths(model.config))
        if self.check_difference > 1e-4:
            raise InputError(f"OpenVINO differs from PyTorch by {self.check_difference:.2e} (> 1e-4) on a check "
                             "batch; use another --backend")
        log.info("OpenVINO (fp32) differs from PyTorch by at most %.2e on a check batch", self.check_difference)

    def _backbone_of(self) -> "OpenVinoModel":
        return OpenVinoModel(self._model.backbone, self._workdir)

    def _run(self, arrays: dict[str, Any]) -> dict[str, Any]:
        return dict(zip(self._names, self._compiled(arrays).to_tuple()))


class JaxModel(ForeignModel):
    """The Flax NNX model (`bertforge.jax`), jit-compiled per padded width."""

    engine = "--backend jax"
    BUCKET = 32  # widths are padded to a multiple of this, so few shapes compile

    def __init__(self, model: torch.nn.Module, backbone_only: bool = False) -> None:
        import jax

        from ..jax.bert import MODELS, seeded
        from ..jax.checkpoint import load_torch_state

        source = model.backbone if backbone_only and hasattr(model, "backbone") else model
        architecture = source.hf_architecture  # a RoBERTa's backbone is RobertaModel, which JAX does not have
        if architecture not in MODELS:
            raise InputError(f"--backend jax has no {architecture} yet; JAX has {', '.join(MODELS)}")
        super().__init__(source)
        self._whole = model
        if architecture == "BertModel":  # a backbone built without its pooler stays without it
            self._jax = MODELS[architecture](model.config, seeded(0), add_pooling_layer=source.pooler is not None)
        else:
            self._jax = MODELS[architecture](model.config, seeded(0))
        load_torch_state(self._jax, source.state_dict())
        self._jax.eval()
        # The outputs as a dict: a pytree jit can return (the output dataclasses are not).
        self._forward = jax.jit(lambda ids, types, mask: dict(vars(self._jax(ids, types, mask))))

    def _backbone_of(self) -> "JaxModel":
        return JaxModel(self._whole, backbone_only=True)

    def _run(self, arrays: dict[str, Any]) -> dict[str, Any]:
        import jax.numpy as jnp

        T = arrays["input_ids"].shape[1]
        width = max(T, min(-(-T // self.BUCKET) * self.BUCKET, self._model.config.max_sequence_length))
        padded = [jnp.asarray(np.pad(arrays[k], ((0, 0), (0, width - T))))
                  for k in ("input_ids", "token_type_ids", "attention_mask")]
        out = self._forward(*padded)
        # Trim the padding off again: per-token outputs back to T.
        return {k: (np.asarray(v)[:, :T] if np.ndim(v) == 3 else np.asarray(v))
                for k, v in out.items() if v is not None and k in ("last_hidden_state", "pooler_output", "logits")}


def _widened(out: Any) -> Any:
    """A model's outputs with every bfloat16 tensor made float32 (dataclasses, tuples and lists walked)."""
    if isinstance(out, torch.Tensor):
        return out.float() if out.dtype == torch.bfloat16 else out
    if dataclasses.is_dataclass(out) and not isinstance(out, type):
        return dataclasses.replace(out, **{f.name: _widened(getattr(out, f.name))
                                           for f in dataclasses.fields(out) if f.init})
    if isinstance(out, (tuple, list)):
        return type(out)(_widened(v) for v in out)
    return out


class Bf16Model:
    """A (fused) model called under CPU autocast to bfloat16, its outputs widened back to float32, so the
    pipelines and the server see the dtypes every other backend gives them. `.backbone` runs the same way;
    every other attribute is the model's."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._model = model
        self._backbone: Bf16Model | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = self._model(*args, **kwargs)
        return _widened(out)

    def __getattr__(self, name: str) -> Any:
        if name == "backbone" and hasattr(self._model, "backbone"):
            if self._backbone is None:
                self._backbone = Bf16Model(self._model.backbone)
            return self._backbone
        return getattr(self._model, name)

    def eval(self) -> "Bf16Model":
        return self


def load(model: torch.nn.Module, backend: str, small_batches: bool = False) -> Any:
    """`model` ready to run on `backend` (see the module docstring). small_batches: the caller runs one-text
    batches too (a server), which `auto` then measures and routes (`routed.py`)."""
    if backend not in BACKENDS:
        raise InputError(f"unknown backend {backend!r}; use one of {', '.join(BACKENDS)}")
    if backend == "auto":
        from .routed import load_auto

        return load_auto(model, small_batches, lambda m: OnnxModel(m, int8=False, cached=True))
    if backend == "torch":
        return model.eval()
    if backend == "fused":
        from . import fused

        if not fused.available():  # the same numbers, eagerly: a slower path, not a different answer
            log.warning("this torch build has no oneDNN CPU kernels; --backend fused runs eager PyTorch")
            return model.eval()
        return fused.fuse_for_inference(model)
    if backend == "fused-bf16":
        from ..training.precision import native_bf16

        if native_bf16(torch.device("cpu")) is None:
            log.warning("this CPU has no native bf16 arithmetic (AMX or AVX512-BF16): --backend fused-bf16 "
                        "will be slower than --backend fused here")
        return Bf16Model(load(model, "fused"))
    if backend == "jax":
        from ..errors import require

        require("jax", "jax", "flax", "optax", what="--backend jax")
        return JaxModel(model)
    if backend == "compiled":
        from .pipelines import compile_for_inference

        return compile_for_inference(model.eval())
    from ..errors import require

    require("export", "onnx", "onnxruntime", "onnxscript", what=f"--backend {backend}")
    if backend == "openvino":
        require("openvino", "openvino", what="--backend openvino")
        return OpenVinoModel(model)
    return OnnxModel(model, int8=backend == "onnx-int8")
