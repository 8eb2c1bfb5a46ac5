"""ALBERT, ELECTRA and DeBERTa-v3 checkpoints through bertforge's surfaces: predict on every backend,
fill-mask with `[MASK]`, NER and QA offsets, embeddings, serve's cross-encoder scores, inspect, attention
maps and fine-tuning.

ALBERT and ELECTRA factorise their embeddings (E < H, projected up), ALBERT shares its blocks across
layers, and DeBERTa's attention adds relative-position terms, so these are the surfaces where a shape,
a layer count or an attention path could go wrong. Each checkpoint is a small random transformers
model (every parameter perturbed) saved with a tokenizer of its family trained in the test (ALBERT's
and DeBERTa's SentencePiece Unigram, ELECTRA's WordPiece); each surface's numbers are compared with
what transformers or sentence-transformers computes from the same directory.
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

import bertforge  # noqa: E402
from bertforge.inference.predict import run_predict  # noqa: E402

from conftest import corpus, perturbed  # noqa: E402
from family_checks import (assert_embeds_as_sentence_transformers, assert_fill_mask_as_transformers,  # noqa: E402
                           served_relevance, small_squad)

TEXTS = ["a good film", "a bad film , truly", "Héllo wörld 東京", "not good at all"]
# ALBERT: two groups of two blocks over three layers; ELECTRA: embeddings half the hidden width.
SIZES = {"albert": dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=48,
                        max_position_embeddings=128, embedding_size=16, num_hidden_groups=2, inner_group_num=2),
         "electra": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                         max_position_embeddings=128, embedding_size=16),
         # DeBERTa-v3's settings, with 8 position buckets so that sentences reach the log-spaced ones.
         "deberta-v2": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                            max_position_embeddings=128, type_vocab_size=0, relative_attention=True,
                            position_buckets=8, max_relative_positions=64, pos_att_type="p2c|c2p",
                            share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False),
         # ModernBERT: global, local, local; a window of 1 token either side, so sentences run on the windowed path.
         "modernbert": dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=48,
                            max_position_embeddings=128, local_attention=2, classifier_pooling="mean",
                            pad_token_id=3, cls_token_id=1, bos_token_id=1, sep_token_id=2, eos_token_id=2)}
HEADS = {"masked": ("ForMaskedLM", None), "classifier": ("ForSequenceClassification", ["neg", "pos"]),
         "tagger": ("ForTokenClassification", ["O", "B-PER", "I-PER"]), "reader": ("ForQuestionAnswering", None)}
PREFIX = {"albert": "Albert", "electra": "Electra", "deberta-v2": "DebertaV2", "modernbert": "ModernBert"}
BLOCKS = {"albert": 4, "modernbert": 0}  # BERT-shaped blocks (ALBERT's shared ones counted once); 2 elsewhere
RUNS = {"albert": 3 * 2, "modernbert": 3}  # layers whose attention maps are drawn (ALBERT: each runs two blocks)


def tokenizer_dir(family: str, unigram: dict, root):
    """ALBERT's or DeBERTa's Unigram tokenizer as transformers saved it, or a WordPiece one saved as ELECTRA's."""
    if family in unigram:
        return unigram[family] / "hf"
    tok = bertforge.Tokenizer.train(texts=corpus(), vocab_size=600)
    tok.save(root / "tok")
    config = json.loads((root / "tok" / "tokenizer_config.json").read_text())
    (root / "tok" / "tokenizer_config.json").write_text(json.dumps(config | {"tokenizer_class": "ElectraTokenizer"}))
    return root / "tok"


@pytest.fixture(scope="module", params=["albert", "electra", "deberta-v2", "modernbert"])
def dirs(request, tmp_path_factory, albert_dirs, deberta_dirs, modern_dirs):
    family = request.param
    root = tmp_path_factory.mktemp(family)
    tok_dir = tokenizer_dir(family, {"albert": albert_dirs, "deberta-v2": deberta_dirs, "modernbert": modern_dirs}, root)
    vocab_size = bertforge.AutoTokenizer.from_pretrained(tok_dir).vocab_size
    out = {"family": family}
    torch.manual_seed(0)
    for name, (suffix, labels) in HEADS.items():
        extra = {"id2label": dict(enumerate(labels)), "label2id": {v: i for i, v in enumerate(labels)}} if labels else {}
        config = getattr(transformers, PREFIX[family] + "Config")(vocab_size=vocab_size, **SIZES[family], **extra)
        perturbed(getattr(transformers, PREFIX[family] + suffix)(config)).save_pretrained(root / name)
        for f in tok_dir.iterdir():
            (root / name / f.name).write_bytes(f.read_bytes())
        out[name] = root / name
    return out


@pytest.mark.parametrize("backend", ["torch", "fused", "onnx"])
def test_classify_gives_transformers_pipeline_scores(dirs, backend):
    if backend == "onnx":
        pytest.importorskip("onnxruntime")
    rows = list(run_predict("classify", str(dirs["classifier"]), TEXTS, backend=backend))
    pipe = transformers.pipeline("text-classification", model=str(dirs["classifier"]), device="cpu", top_k=None)
    for row, theirs in zip(rows, pipe(TEXTS)):
        for item in theirs:
            assert row["scores"][item["label"]] == pytest.approx(item["score"], abs=1e-4 if backend != "torch" else 1e-5)


def test_fused_layers_are_each_packed_once(dirs):
    """ALBERT runs its shared blocks several times: the fused path packs each block once and runs it at each use."""
    from bertforge.inference.fused import _FusedLayer, fuse_for_inference
    from bertforge.models.layers import BertLayer

    model = bertforge.AutoModel.from_pretrained(dirs["classifier"])
    blocks = [m for m in model.modules() if isinstance(m, BertLayer)]
    assert len(blocks) == BLOCKS.get(dirs["family"], 2)
    ids = torch.randint(5, 100, (2, 9))
    with torch.no_grad():
        ref = model(ids).last_hidden_state
        fuse_for_inference(model, native_attention=False)
        got = model(ids).last_hidden_state
    # Every block fused (DeBERTa's as its own kind), each packed once however often it runs.
    assert all(isinstance(b.forward, _FusedLayer) and len(b.forward.packs) == 1 for b in blocks)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)


def test_fill_mask_with_the_bracketed_mask(dirs):
    assert_fill_mask_as_transformers(dirs["masked"], "a good [MASK] .")


def test_ner_and_qa_point_at_the_text(dirs):
    text = "Ann Smith lives in Paris"
    for entity in list(run_predict("ner", str(dirs["tagger"]), [text], backend="torch"))[0]["entities"]:
        assert text[entity["start"]:entity["end"]].strip() == entity["word"].strip()
    answer = list(run_predict("qa", str(dirs["reader"]), [{"question": "who lives there?", "context": text}],
                              backend="torch"))[0]
    assert text[answer["start"]:answer["end"]] == answer["answer"] and answer["answer"]


def test_embed_equals_sentence_transformers(dirs):
    assert_embeds_as_sentence_transformers(dirs["classifier"], TEXTS)


def test_served_cross_encoder_scores_are_transformers(dirs, tmp_path):
    """A one-logit classifier served for /rerank scores as transformers (and sentence-transformers' CrossEncoder)."""
    st = pytest.importorskip("sentence_transformers")
    config = json.loads((dirs["classifier"] / "config.json").read_text())
    config = getattr(transformers, PREFIX[dirs["family"]] + "Config")(**{
        k: v for k, v in config.items() if k not in ("id2label", "label2id", "architectures")}, num_labels=1)
    torch.manual_seed(1)
    perturbed(getattr(transformers, PREFIX[dirs["family"]] + "ForSequenceClassification")(config)).save_pretrained(tmp_path)
    for f in dirs["classifier"].iterdir():
        if f.name.startswith(("tokenizer", "special", "vocab", "spiece", "spm")):
            (tmp_path / f.name).write_bytes(f.read_bytes())
    pairs = [("what is a good film?", t) for t in TEXTS]
    ours = served_relevance(tmp_path, pairs, backend="fused")
    # bertforge sends segment ids with every pair, as BERT's and ALBERT's pretraining did. transformers 5's
    # AlbertTokenizer sends none unless asked, so CrossEncoder scores an ALBERT pair as one segment: the
    # reference is transformers' model given the segment ids, and CrossEncoder itself where the two agree.
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        logits = model(**tok([q for q, _ in pairs], [d for _, d in pairs], padding=True, return_tensors="pt",
                             return_token_type_ids=True)).logits[:, 0]
    assert ours == pytest.approx(logits.sigmoid().tolist(), abs=1e-4)
    if "token_type_ids" in tok.model_input_names:
        theirs = st.CrossEncoder(str(tmp_path), device="cpu").predict(pairs)
        assert ours == pytest.approx([float(x) for x in theirs], abs=1e-4)


def test_inspect_and_attention_maps(dirs):
    from bertforge.interop.inspect import inspect_checkpoint
    from bertforge.tokenization.kinds import load_tokenizer
    from bertforge.viz import attention_maps

    report = inspect_checkpoint(dirs["classifier"])
    model = bertforge.AutoModelForSequenceClassification.from_pretrained(dirs["classifier"])
    assert report["architecture"] == PREFIX[dirs["family"]] + "ForSequenceClassification"
    assert report["missing_keys"] == [] == report["unexpected_keys"]
    assert report["parameters"]["total"] == model.num_parameters()  # shared blocks counted once
    encoder = bertforge.AutoModel.from_pretrained(dirs["classifier"])
    tokens, attn = attention_maps(encoder, load_tokenizer(dirs["classifier"]), "a good film", "yes")
    assert tokens[0] == "[CLS]" and attn.shape[:2] == (RUNS.get(dirs["family"], 2), 4)


@pytest.mark.parametrize("task", ["classify", "qa"])
def test_finetune(dirs, tmp_path, task):
    """`finetune classify|qa` from the checkpoint's backbone builds its family's head and writes what transformers
    loads; QA runs through the family's offsets (ALBERT's Unigram) and is scored by the official rules."""
    from conftest import shared
    from cli_utils import cli as run, slice_file

    if task == "qa":
        train, dev = small_squad(tmp_path)
        extra = ["--seq-len", "128", "--doc-stride", "32"]
    else:
        train = slice_file(shared("glue", "SST-2", "train.tsv"), tmp_path / "train", 65)
        dev = slice_file(shared("glue", "SST-2", "dev.tsv"), tmp_path / "dev", 33)
        extra = ["--seq-len", "48"]
    out = tmp_path / "out"
    result = run("finetune", task, "--model", str(dirs["masked"]), "--train", str(train), "--dev", str(dev),
                 "--out", str(out), "--epochs", "1", "--batch-size", "16", *extra)
    assert result.returncode == 0, result.stderr
    arch = PREFIX[dirs["family"]] + ("ForQuestionAnswering" if task == "qa" else "ForSequenceClassification")
    assert json.loads((out / "config.json").read_text())["architectures"] == [arch]
    _, info = getattr(transformers, arch).from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    if task == "qa":
        results = json.loads((out / "eval_results.json").read_text())
        assert {"exact_match", "f1"} <= set(results) and 0 <= results["f1"] <= 100


def test_electra_discriminator_is_refused_for_fill_mask_naming_the_generator(tmp_path):
    """The discriminator scores tokens as replaced or not; fill-mask needs ELECTRA's generator, and the refusal
    names it (not every family's masked-LM class)."""
    from bertforge.errors import BertforgeError

    tok = bertforge.Tokenizer.train(texts=corpus()[:200], vocab_size=200)
    config = transformers.ElectraConfig(vocab_size=tok.vocab_size, **SIZES["electra"])
    transformers.ElectraForPreTraining(config).save_pretrained(tmp_path)
    tok.save(tmp_path)
    with pytest.raises(BertforgeError, match=r"ElectraForPreTraining, which has no head for fill-mask; it needs "
                                             r"ElectraForMaskedLM \(fine-tune"):
        list(run_predict("fill-mask", str(tmp_path), ["a [MASK] film"], backend="torch"))
    # It is a pretraining model all the same: AutoModelForPreTraining builds it, and it scores every token.
    model = bertforge.AutoModelForPreTraining.from_pretrained(tmp_path)
    ids = torch.tensor([tok("a good film")["input_ids"]])
    assert type(model).__name__ == "ElectraForPreTraining" and model(ids).logits.shape == ids.shape
