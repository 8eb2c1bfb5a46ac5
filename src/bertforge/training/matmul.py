"""Which library runs fp32 training's linear layers on the CPU: torch's BLAS, or oneDNN.

torch's CPU wheels run an fp32 `F.linear` and both its gradients on their BLAS (MKL's sgemm on
x86). oneDNN, which torch also ships (the fused inference path's matmuls), is not always slower:
a 2048² fp32 matmul ran at 480 GFLOP/s on oneDNN against 210 on MKL on one AVX-512 host, and 5-50%
slower than MKL on this project's AMX host (docs/results.md). Neither is right everywhere, so
`--matmul auto` (the default) measures.

- **What is measured.** The first time a run meets a linear layer's shape (in features K, out
  features O) in a training forward pass, both libraries run that layer's forward and its two
  gradients on the run's own token count, interleaved, a few times; the faster median wins. The
  choice is per shape: a host can favour oneDNN for the decoder's [H, vocab] and MKL for [H, H].
  Linears under 50 MFLOP a step (a test's toy model) stay on torch's BLAS without measuring.
- **Reproducible.** A timing is noisy, a bit-for-bit rerun is not allowed to be. Each choice is
  cached per machine (CPU model, torch version, thread count, shape, token count to a power of
  two) in `$BERTFORGE_CACHE_DIR/matmuls.json` (default `~/.cache/bertforge`): a second run with the
  same inputs reads the same choices and gives the same bits. The first writer of a key wins
  (under a file lock), so two runs started together agree too.
- **Resume.** The run's choices are part of its settings (`run_info["matmuls"]`), saved with every
  checkpoint; a resumed run takes them from there, whatever this machine's cache now says.
- **Distributed runs** do not measure (every rank shares the cores, so timings would lie): they use
  the cached choice, else torch's BLAS, and say so.
- `--matmul torch` or `--matmul onednn` pins the library; bf16 autocast already runs on oneDNN
  (torch sends bf16 matmuls there), and GPUs on cuBLAS, so the choice applies to fp32 on the CPU only.

The oneDNN path is `OneDNNLinear`: y = x W^T + b, dX = dY W, dW = dY^T X, db = sum dY, each product
through `torch.ops.mkldnn._linear_pointwise`. Its gradients equal torch's to fp32 rounding (tested).
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .. import machine_cache
from ..models.padding import bucket_rows, pad_rows

MATMULS = ("auto", "torch", "onednn")
_mkldnn = torch.ops.mkldnn
PROBE_REPEATS = 5
# A linear whose forward and two gradients come to fewer FLOPs than this (~0.2 ms on a 2-core host)
# is left on torch's BLAS unmeasured: its timings would be mostly noise, and the most a faster
# library could save there is less than the measuring costs.
MIN_FLOPS = 50e6


def available() -> bool:
    """Whether this torch build has oneDNN's CPU linear kernel."""
    return torch.backends.mkldnn.is_available() and hasattr(_mkldnn, "_linear_pointwise")


def _onednn_mm(a: torch.Tensor, b_t: torch.Tensor) -> torch.Tensor:
    """a [M, K] @ b_t^T, with b_t [N, K] (any strides): oneDNN's linear without bias or post-op."""
    return _mkldnn._linear_pointwise(a, b_t, None, "none", [], "")


class OneDNNLinear(torch.autograd.Function):
    """F.linear on oneDNN: x float32 [..., K], weight [O, K], bias [O] or None -> [..., O]."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        ctx.save_for_backward(x2, weight)
        ctx.has_bias = bias is not None
        ctx.in_shape = x.shape
        return _mkldnn._linear_pointwise(x2, weight, bias, "none", [], "").view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x2, weight = ctx.saved_tensors
        g = grad.reshape(-1, grad.shape[-1])
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = _onednn_mm(g, weight.t()).view(ctx.in_shape)  # [N, O] @ [O, K]
        if ctx.needs_input_grad[1]:
            dw = _onednn_mm(g.t(), x2.t())  # [O, N] @ [N, K]
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = g.sum(0)
        return dx, dw, db


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear` with the forward and both gradients on oneDNN (float32, CPU)."""
    return OneDNNLinear.apply(x, weight, bias)


def cache_file() -> Path:
    """Where `auto`'s choices are kept (`machine_cache.root()`)."""
    return machine_cache.root() / "matmuls.json"


def probe(k: int, o: int, n: int, bias: bool, repeats: int = PROBE_REPEATS) -> dict[str, float]:
    """Median seconds of a [n, k] x [k, o] linear's forward and both gradients, per library, interleaved.
    Runs on its own tensors (no autograd, no draw from torch's generator)."""
    x, w = torch.ones(n, k), torch.ones(o, k)
    b = torch.ones(o) if bias else None
    g = torch.ones(n, o)
    runs: dict[str, Callable[[], Any]] = {
        "torch": lambda: (F.linear(x, w, b), g @ w, g.t() @ x),
        "onednn": lambda: (_mkldnn._linear_pointwise(x, w, b, "none", [], ""), _onednn_mm(g, w.t()),
                           _onednn_mm(g.t(), x.t())),
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    with torch.no_grad():
        for run in runs.values():
            run()
        for _ in range(repeats):
            for name, run in runs.items():
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(v) for name, v in times.items()}


class MatmulChoice:
    """The library of each fp32 linear shape a run meets; `context()` routes training's F.linear by it.

    setting: auto, torch or onednn. measure: whether `auto` may time a shape it has no cached choice
    for (False in distributed runs). probe: the timing function (a test can pass its own).
    min_flops: smaller linears stay on torch's BLAS unmeasured."""

    def __init__(self, setting: str = "auto", measure: bool = True,
                 probe: Callable[..., dict[str, float]] | None = None, min_flops: float | None = None) -> None:
        if setting not in MATMULS:
            raise ValueError(f"matmul must be one of {', '.join(MATMULS)}, not {setting!r}")
        if setting == "onednn" and not available():
            from ..errors import BertforgeError
            raise BertforgeError("--matmul onednn: this torch build has no oneDNN CPU linear kernel; use --matmul torch")
        self.setting, self.measure = setting, measure
        self._probe = probe or globals()["probe"]
        self.min_flops = MIN_FLOPS if min_flops is None else min_flops
        self.choices: dict[str, str] = {}  # "KxO" -> torch | onednn: what the run's settings record
        self.settled = False  # set after the first optimizer step: every shape of the model has been met
        self.reasons: list[str] = []  # one line per shape decided in this process, for the log

    def restore(self, setting: str, choices: dict[str, str]) -> None:
        """Take a resumed run's setting and the choices it made (they override the cache and any measuring)."""
        self.setting = setting
        self.choices.update(choices)
        self.settled = bool(choices)  # the shapes were met before the checkpoint

    def library(self, k: int, o: int, n: int, bias: bool) -> str:
        """torch or onednn for a [n, k] x [k, o] linear; decided (and recorded) on first meeting."""
        if self.setting != "auto":
            return self.setting
        shape = f"{k}x{o}"
        if shape not in self.choices:
            self.choices[shape] = self._decide(k, o, n, bias)
        return self.choices[shape]

    def _decide(self, k: int, o: int, n: int, bias: bool) -> str:
        if not available() or 6 * n * k * o < self.min_flops:
            return "torch"
        try:
            return self._cached_or_measured(k, o, n, bias)
        except OSError as exc:
            # Without the cache a timing could choose differently on a rerun: keep the default, which is
            # the same every time, and say why.
            self.reasons.append(f"{k}x{o}: torch (cannot use the cache {cache_file()}: {exc.strerror or exc}; "
                                "auto keeps torch's BLAS so that reruns give the same bits)")
            return "torch"

    def _cached_or_measured(self, k: int, o: int, n: int, bias: bool) -> str:
        key = f"{machine_cache.machine_key()} | {k}x{o} | n~{2 ** round(math.log2(max(n, 1)))}"
        with machine_cache.locked_json("matmuls.json") as entries:
            if entries.get(key) in ("torch", "onednn"):
                self.reasons.append(f"{k}x{o}: {entries[key]} (measured earlier on this machine)")
                return entries[key]
            if not self.measure:
                self.reasons.append(f"{k}x{o}: torch (no cached measurement; distributed runs do not measure)")
                return "torch"
            seconds = self._probe(k, o, n, bias)
            choice = "onednn" if seconds["onednn"] < seconds["torch"] else "torch"
            entries[key] = choice
        self.reasons.append(f"{k}x{o}: {choice} (forward and gradients, {n} rows: torch's BLAS "
                            f"{seconds['torch'] * 1e3:.2f} ms, oneDNN {seconds['onednn'] * 1e3:.2f} ms)")
        return choice

    def applies(self, device: torch.device, precision: str) -> bool:
        """Whether this run's linears are routed at all: fp32 on the CPU, and not pinned to torch's BLAS."""
        return device.type == "cpu" and precision == "fp32" and self.setting != "torch"

    def context(self) -> contextlib.AbstractContextManager:
        """Around a training forward pass: F.linear on float32 CPU tensors goes to the chosen library.
        Once settled with every shape on torch's BLAS, nothing is routed: the route's per-call check
        would cost time for nothing. (A shape first met later then runs on torch's BLAS, always.)"""
        if self.settled and self.setting == "auto" and "onednn" not in self.choices.values():
            return contextlib.nullcontext()
        return _RouteLinear(self)


class _PadRows(torch.autograd.Function):
    """x float32 or bf16 [N, C] -> bf16 [rows, C]: x cast (autocast's cast, in the same pass) into the
    first N rows, zeros below. The backward pass hands back the first N rows of the gradient (autograd
    casts them to x's dtype, as it does for autocast's cast)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, rows: int) -> torch.Tensor:
        ctx.n = x.shape[0]
        return pad_rows(x, rows, torch.bfloat16)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad[:ctx.n], None


# Activations whose output row depends on that row alone, so they may run on padded rows too.
_ROWWISE = (F.gelu, F.relu, F.silu)


class BucketBF16(TorchFunctionMode):
    """Around a bf16-autocast training step on the CPU: the linears see bucketed token counts.

    oneDNN, which runs autocast's bf16 matmuls on the CPU, compiles a primitive for each new shape:
    ~1.3 ms for a [~2000, 256] x [256, 256] product on a 2-core Xeon, ~20 ms for the decoder's
    [~300, 256] x [256, 30522] gradient, many times what the product itself takes. An unpadded batch
    has a new token count nearly every step, so each of a step's ~80 products compiled anew. Here an
    F.linear on N rows that is not a bucket (`padding.bucket_rows`) runs on its input padded with zero
    rows to the bucket, and its output is sliced back to N rows: the forward product and both
    gradients see the bucketed shape, which recurs, so oneDNN's primitive cache serves them. The
    zero rows contribute exact zeros to the weight's gradient and receive no gradient. One padded
    copy is made per input tensor (query, key and value share theirs), cast to bf16 in the same pass.

    A feed-forward block stays padded from its first linear to its second: a row-wise activation
    (GELU, ReLU, SiLU) of a sliced linear output runs on the whole padded output, and a linear of
    that activation's slice takes the padded tensor itself. The padding rows then hold the
    activation of the bias, not zeros; they are finite, the gradient they receive from the sliced
    output is zero, so they still add exact zeros to the weight's gradient. That saves padding the
    widest activation again ([N, 4H]) and zero-filling its gradient's padding in the backward pass.
    """

    # It acts under bf16 autocast only, so the masked-LM head may fuse its fp32 decoder with the loss
    # under it (`kernels/cross_entropy.py`'s `linear_cross_entropy`).
    leaves_fp32_linear = True

    def __init__(self) -> None:
        super().__init__()
        # The last input padded, and its copy: query, key and value come one after another with the
        # same input. Only the last is kept, so no activation outlives its use for longer than that.
        self._last: tuple[torch.Tensor, torch.Tensor] | None = None
        # The last two slices handed out, each with the padded tensor it is the first rows of.
        self._sliced: list[tuple[torch.Tensor, torch.Tensor]] = []

    def _padded(self, x: torch.Tensor) -> torch.Tensor | None:
        return next((full for view, full in self._sliced if view is x), None)

    def _slice(self, full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """full [rows, C] -> its first rows, shaped as `like` with C last; remembered as full's slice."""
        n = like.numel() // like.shape[-1]
        out = full[:n].view(*like.shape[:-1], full.shape[-1])
        self._sliced = [*self._sliced[-1:], (out, full)]
        return out

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear and _bf16_autocast_on_cpu():
            x = args[0]
            full = self._padded(x)
            if full is not None:  # the slice of a padded activation: take the padded tensor itself
                return self._slice(func(full, *args[1:], **kwargs), x)
            n = x.numel() // x.shape[-1] if x.dim() >= 2 else 0
            if (n and x.device.type == "cpu" and x.dtype in (torch.float32, torch.bfloat16)
                    and bucket_rows(n) != n):
                if self._last is None or self._last[0] is not x:
                    self._last = (x, _PadRows.apply(x.reshape(n, x.shape[-1]), bucket_rows(n)))
                return self._slice(func(self._last[1], *args[1:], **kwargs), x)
        elif func in _ROWWISE and args and isinstance(args[0], torch.Tensor):
            full = self._padded(args[0])
            if full is not None:
                return self._slice(func(full, *args[1:], **kwargs), args[0])
        return func(*args, **kwargs)


def _bf16_autocast_on_cpu() -> bool:
    return torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16


class _RouteLinear(TorchFunctionMode):
    def __init__(self, choice: MatmulChoice) -> None:
        super().__init__()
        self.choice = choice

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            if (x.dtype == torch.float32 and weight.dtype == torch.float32 and x.device.type == "cpu"
                    and x.dim() >= 2 and not torch.is_autocast_enabled("cpu")
                    and self.choice.library(weight.shape[1], weight.shape[0], x.numel() // x.shape[-1],
                                            bias is not None) == "onednn"):
                return OneDNNLinear.apply(x, weight, bias)
        return func(*args, **kwargs)
