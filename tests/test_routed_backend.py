"""`--backend auto`: measured once per machine and shape, kept, said; one-row calls routed to ONNX Runtime up to the
measured length and everything else to the batch path; the export cached by weights and re-checked."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from bertforge import BertConfig, BertModel  # noqa: E402
from bertforge import machine_cache  # noqa: E402
from bertforge.inference import backends, export, routed  # noqa: E402


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BERTFORGE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _model(seed: int = 0) -> BertModel:
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=48, max_position_embeddings=160)
    return BertModel(config).eval()


def _ids(rows: int, length: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(5, 120, (rows, length), generator=torch.Generator().manual_seed(length))
    return {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": torch.ones_like(ids)}


def _fake_timings(onnx_wins_up_to: int):
    """Stands in for the clock: ONNX Runtime takes half the batch path's time on rows up to `onnx_wins_up_to`
    tokens and twice it beyond; fused beats eager on batches."""
    def timings(runners, inputs, repeats=routed.REPEATS):
        rows, length = inputs["input_ids"].shape
        if "onnx" in runners:
            other = next(name for name in runners if name != "onnx")
            return {"onnx": 1.0 if length <= onnx_wins_up_to else 4.0, other: 2.0}
        return {"fused": 1.0, "torch": 1.5}
    return timings


def test_one_rows_up_to_the_measured_length_go_to_onnx_runtime(cache, monkeypatch):
    monkeypatch.setattr(routed, "MIN_PARAMS", 0)
    monkeypatch.setattr(routed, "timings", _fake_timings(32))
    reference = _model()
    model = backends.load(_model(), "auto", small_batches=True)
    route = model.route
    assert (route.batch, route.single, route.limit, route.source) == ("fused", "onnx", 32, "measured now")
    assert "onnx for one row of up to 32 tokens" in route.describe() and "fused for batches" in route.describe()
    calls = []
    single = model._single
    monkeypatch.setattr(model, "_single", lambda *a, **k: calls.append("onnx") or single(*a, **k))
    with torch.inference_mode():
        for rows, length, engine in ((1, 8, "onnx"), (1, 32, "onnx"), (1, 33, "batch"), (2, 8, "batch")):
            calls.clear()
            got = model(**_ids(rows, length)).last_hidden_state
            assert calls == (["onnx"] if engine == "onnx" else []), (rows, length)
            # Either engine gives PyTorch's numbers to float rounding.
            assert (got - reference(**_ids(rows, length)).last_hidden_state).abs().max() < 1e-5
    # The choice is kept for this machine and shape: the next start reads it, measuring nothing.
    monkeypatch.setattr(routed, "timings", _fake_timings(1000))
    again = backends.load(_model(), "auto", small_batches=True).route
    assert (again.limit, again.source) == (32, "cached choice")
    entries = json.loads((cache / "backends.json").read_text())
    assert [e["limit"] for e in entries.values()] == [32]


def test_no_one_row_path_where_onnx_runtime_is_not_faster_or_not_asked(cache, monkeypatch):
    monkeypatch.setattr(routed, "MIN_PARAMS", 0)
    monkeypatch.setattr(routed, "timings", _fake_timings(0))
    route = backends.load(_model(), "auto", small_batches=True).route
    assert route.single is None and route.limit == 0
    assert "no one-row path (ONNX Runtime was not faster at one row of 8 tokens)" in route.describe()
    exported = []
    monkeypatch.setattr(export, "export_model", lambda *a, **k: exported.append(a))
    batches = backends.load(_model(), "auto").route  # predict: batches alone, nothing exported
    assert batches.single is None and exported == [] and "batches only" in batches.describe()


def test_eager_pytorch_is_chosen_where_it_beats_fused_by_the_margin(cache, monkeypatch):
    monkeypatch.setattr(routed, "timings", lambda runners, inputs, repeats=7: {"fused": 2.0, "torch": 1.0})
    model = backends.load(_model(), "auto")
    assert model.route.batch == "torch" and "torch for batches" in model.route.describe()
    with torch.inference_mode():
        out = model(**_ids(2, 9)).last_hidden_state
        assert torch.equal(out, _model()(**_ids(2, 9)).last_hidden_state)  # eager: PyTorch's own bits


def test_a_toy_model_is_not_measured_for_one_row(cache):
    route = backends.load(_model(), "auto", small_batches=True).route
    assert route.single is None and "under 4M encoder parameters" in route.describe()


def test_the_export_is_cached_by_weights_and_checked_again(cache, monkeypatch):
    first = backends.OnnxModel(_model(), int8=False, cached=True)
    files = list((cache / "onnx").glob("*.onnx"))
    assert len(files) == 1
    exported = []
    real = export.export_model
    monkeypatch.setattr(export, "export_model", lambda *a, **k: exported.append(1) or real(*a, **k))
    again = backends.OnnxModel(_model(), int8=False, cached=True)
    assert exported == [] and again.check_difference == pytest.approx(first.check_difference, abs=1e-7)
    # Other weights: another file. A damaged file: exported again, never used.
    backends.OnnxModel(_model(seed=1), int8=False, cached=True)
    assert len(exported) == 1 and len(list((cache / "onnx").glob("*.onnx"))) == 2
    files[0].write_bytes(b"not a graph")
    backends.OnnxModel(_model(), int8=False, cached=True)
    assert len(exported) == 2 and files[0].stat().st_size > 100


def test_a_damaged_choice_file_is_measured_again(cache, monkeypatch):
    monkeypatch.setattr(routed, "timings", _fake_timings(0))
    (cache).mkdir(parents=True)
    (cache / "backends.json").write_text("{not json")
    assert backends.load(_model(), "auto").route.source == "measured now"
    assert json.loads((cache / "backends.json").read_text())


def test_the_server_says_what_auto_chose(cache, minilm_dir):
    from server_utils import call, running_server

    with running_server(minilm_dir) as (port, proc):
        status, info = call(port, "/info")
        assert status == 200 and info["backend"].startswith("auto: ")
        status, answer = call(port, "/embed", {"inputs": "a query arriving alone"})
        assert status == 200 and len(answer[0]) == 384
        proc.log.seek(0)
        assert f"bertforge: backend {info['backend']}" in proc.log.read().decode()


def test_machine_cache_root_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("BERTFORGE_CACHE_DIR", str(tmp_path / "x"))
    assert machine_cache.root() == tmp_path / "x"
    monkeypatch.delenv("BERTFORGE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert machine_cache.root() == tmp_path / "xdg" / "bertforge"


def test_a_capped_instruction_set_is_another_machine(cache, monkeypatch):
    # A choice timed on AVX-512 kernels must not be reused where oneDNN or MKL is capped at AVX2 (their kernels,
    # and so the winner, differ): the cap is part of the key, and auto measures again under it.
    for name in machine_cache.ISA_CAPS:
        monkeypatch.delenv(name, raising=False)
    plain = machine_cache.machine_key()
    assert torch.backends.cpu.get_cpu_capability() in plain
    calls = []

    def timings(runners, inputs, repeats=7):
        calls.append(1)
        return {"fused": 1.0, "torch": 2.0}

    monkeypatch.setattr(routed, "timings", timings)
    backends.load(_model(), "auto")
    backends.load(_model(), "auto")
    assert len(calls) == 1  # the second load read the choice
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert machine_cache.machine_key() == plain + " | ONEDNN_MAX_CPU_ISA=AVX2"
    backends.load(_model(), "auto")
    assert len(calls) == 2
    keys = list(json.loads((cache / "backends.json").read_text()))
    assert len(keys) == 2 and any("ONEDNN_MAX_CPU_ISA=AVX2" in k for k in keys)
