"""RoBERTa and XLM-RoBERTa checkpoints through bertforge's surfaces: predict, serve's runners, backends,
inspect, attention maps, and the refusals around them.

Each checkpoint is a small random transformers model (every parameter perturbed) saved with a
tokenizer of its family trained in the test; each surface's numbers are compared with what
transformers or sentence-transformers computes from the same directory.
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

import bertforge  # noqa: E402
from bertforge.errors import BertforgeError  # noqa: E402
from bertforge.inference.predict import run_predict  # noqa: E402
from bertforge.tokenization.bpe import ByteLevelBPETokenizer  # noqa: E402

from conftest import corpus, perturbed  # noqa: E402
from family_checks import (assert_embeds_as_sentence_transformers, assert_fill_mask_as_transformers,  # noqa: E402
                           served_relevance, small_squad)

TEXTS = ["a good film", "a bad film , truly", "Héllo wörld 東京", "not good at all"]
SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
             max_position_embeddings=66, type_vocab_size=1, layer_norm_eps=1e-5)


@pytest.fixture(scope="module")
def roberta_dirs(tmp_path_factory):
    """A RoBERTa of each head, each with the same byte-level BPE tokenizer."""
    root = tmp_path_factory.mktemp("roberta")
    bpe = ByteLevelBPETokenizer.train(texts=corpus(), vocab_size=400)
    out = {}
    torch.manual_seed(0)
    for name, cls, labels in (("masked", "RobertaForMaskedLM", None),
                              ("classifier", "RobertaForSequenceClassification", ["neg", "pos"]),
                              ("tagger", "RobertaForTokenClassification", ["O", "B-PER", "I-PER"]),
                              ("reader", "RobertaForQuestionAnswering", None)):
        extra = {"id2label": dict(enumerate(labels)), "label2id": {v: i for i, v in enumerate(labels)}} if labels else {}
        config = transformers.RobertaConfig(vocab_size=bpe.vocab_size, **SIZES, **extra)
        perturbed(getattr(transformers, cls)(config)).save_pretrained(root / name)
        bpe.save(root / name)
        out[name] = root / name
    return out


def test_classify_gives_transformers_probabilities(roberta_dirs):
    rows = list(run_predict("classify", str(roberta_dirs["classifier"]), TEXTS, backend="torch"))
    tok = transformers.AutoTokenizer.from_pretrained(roberta_dirs["classifier"])
    model = transformers.AutoModelForSequenceClassification.from_pretrained(roberta_dirs["classifier"]).eval()
    with torch.no_grad():
        probs = model(**tok(TEXTS, padding=True, return_tensors="pt")).logits.softmax(-1)
    for row, p in zip(rows, probs):
        assert set(row["scores"]) == {"neg", "pos"}
        assert row["scores"]["pos"] == pytest.approx(float(p[1]), abs=1e-5)


@pytest.mark.parametrize("backend", ["fused", "onnx"])
def test_backends_agree_with_torch_on_roberta(roberta_dirs, backend):
    if backend == "onnx":
        pytest.importorskip("onnxruntime")
    ref = list(run_predict("classify", str(roberta_dirs["classifier"]), TEXTS, backend="torch"))
    got = list(run_predict("classify", str(roberta_dirs["classifier"]), TEXTS, backend=backend))
    for a, b in zip(ref, got):
        assert b["scores"]["pos"] == pytest.approx(a["scores"]["pos"], abs=1e-4)


def test_fill_mask_reads_the_mask_token_of_the_family(roberta_dirs):
    assert_fill_mask_as_transformers(roberta_dirs["masked"], "a good <mask> .")


def test_ner_and_qa_map_byte_level_tokens_back_to_characters(roberta_dirs):
    """Entities and answers are character spans of the input (BPE offsets trimmed of their spaces)."""
    text = "John lives in Paris ."
    entities = list(run_predict("ner", str(roberta_dirs["tagger"]), [text], backend="torch"))[0]["entities"]
    assert entities, "a random tagger with 3 tags tags something in 5 words"
    for entity in entities:
        assert text[entity["start"]:entity["end"]] == entity["word"] and entity["word"] == entity["word"].strip()
    answer = list(run_predict("qa", str(roberta_dirs["reader"]), [{"question": "who lives there?", "context": text}],
                              backend="torch"))[0]
    assert text[answer["start"]:answer["end"]] == answer["answer"] != ""


def test_embed_equals_sentence_transformers(roberta_dirs):
    assert_embeds_as_sentence_transformers(roberta_dirs["classifier"], TEXTS)


def test_xlmr_cross_encoder_reranks_as_sentence_transformers(unigram_dirs, tmp_path):
    """A bge-reranker-shaped model (XLM-R, one relevance logit): serve's scores are CrossEncoder's."""
    st = pytest.importorskip("sentence_transformers")
    tok_dir = unigram_dirs / "hf"
    vocab = json.loads((tok_dir / "tokenizer.json").read_text())["model"]["vocab"]
    config = transformers.XLMRobertaConfig(vocab_size=len(vocab), **SIZES, num_labels=1)
    torch.manual_seed(1)
    perturbed(transformers.XLMRobertaForSequenceClassification(config)).save_pretrained(tmp_path)
    for f in tok_dir.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    pairs = [("what is a good film?", t) for t in TEXTS]
    ours = served_relevance(tmp_path, pairs, backend="torch")
    theirs = st.CrossEncoder(str(tmp_path), device="cpu").predict(pairs)
    assert ours == pytest.approx([float(x) for x in theirs], abs=1e-5)


def test_attention_maps_and_inspect_read_roberta(roberta_dirs):
    from bertforge.interop.inspect import inspect_checkpoint
    from bertforge.tokenization.kinds import load_tokenizer
    from bertforge.viz import attention_maps

    encoder = bertforge.AutoModel.from_pretrained(roberta_dirs["classifier"])
    tokens, attn = attention_maps(encoder, load_tokenizer(roberta_dirs["classifier"]), "a good film", "yes")
    assert tokens[0] == "<s>" and attn.shape[:2] == (2, 4)
    report = inspect_checkpoint(roberta_dirs["classifier"])
    assert report["architecture"] == "RobertaForSequenceClassification"
    assert report["missing_keys"] == [] and report["unexpected_keys"] == []


def test_a_bert_class_refuses_a_roberta_directory(roberta_dirs):
    with pytest.raises(BertforgeError, match="model_type is 'roberta'.*BertModel reads 'bert'"):
        bertforge.BertModel.from_pretrained(roberta_dirs["classifier"])


@pytest.fixture(scope="module")
def roberta_backbone(tmp_path_factory):
    """A bare RoBERTa (no head) with a BPE tokenizer trained on WikiText: what a user fine-tunes from."""
    path = tmp_path_factory.mktemp("roberta-base")
    bpe = ByteLevelBPETokenizer.train(texts=corpus(), vocab_size=1000)
    config = transformers.RobertaConfig(vocab_size=bpe.vocab_size, **(SIZES | {"max_position_embeddings": 130}))
    torch.manual_seed(0)
    transformers.RobertaModel(config).save_pretrained(path)
    bpe.save(path)
    return path


@pytest.mark.parametrize("task, files, arch", [
    ("classify", ("glue/RTE/train.tsv", "glue/RTE/dev.tsv"), "RobertaForSequenceClassification"),
    ("ner", ("conll2003/train.txt", "conll2003/valid.txt"), "RobertaForTokenClassification"),
    ("qa", None, "RobertaForQuestionAnswering"),
])
def test_finetune_a_roberta(tmp_path, roberta_backbone, task, files, arch):
    """`finetune` builds the head of the checkpoint's family and writes what transformers loads (QA through
    byte-level BPE offsets, scored by the official rules)."""
    from conftest import shared
    from cli_utils import cli as run, slice_file

    if task == "qa":
        train, dev = small_squad(tmp_path)
    else:
        lines = 65 if task == "classify" else 300
        train = slice_file(shared(*files[0].split("/")), tmp_path / "train", lines)
        dev = slice_file(shared(*files[1].split("/")), tmp_path / "dev", lines // 2)
    out = tmp_path / "out"
    result = run("finetune", task, "--model", str(roberta_backbone), "--train", str(train), "--dev", str(dev),
                 "--out", str(out), "--epochs", "1", "--batch-size", "16",
                 *(["--seq-len", "128", "--doc-stride", "32"] if task == "qa" else ["--seq-len", "64"]))
    assert result.returncode == 0, result.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [arch] and config["model_type"] == "roberta"
    model, info = getattr(transformers, arch).from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert isinstance(bertforge.AutoTokenizer.from_pretrained(out), ByteLevelBPETokenizer)


@pytest.fixture(scope="module")
def distilbert_classifier(tmp_path_factory):
    """The shape of transformers' default sentiment model (a DistilBERT SST-2 classifier), small and random."""
    path = tmp_path_factory.mktemp("distilbert")
    tok = bertforge.Tokenizer.train(texts=corpus(), vocab_size=600)
    config = transformers.DistilBertConfig(vocab_size=tok.vocab_size, dim=32, n_layers=2, n_heads=4, hidden_dim=48,
                                           max_position_embeddings=64, id2label={0: "NEGATIVE", 1: "POSITIVE"},
                                           label2id={"NEGATIVE": 0, "POSITIVE": 1})
    torch.manual_seed(0)
    perturbed(transformers.DistilBertForSequenceClassification(config)).save_pretrained(path)
    tok.save(path)
    tok_config = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps(tok_config | {"tokenizer_class": "DistilBertTokenizer"}))
    return path


@pytest.mark.parametrize("backend", ["torch", "fused", "onnx"])
def test_distilbert_sentiment_as_transformers_pipeline(distilbert_classifier, backend):
    if backend == "onnx":
        pytest.importorskip("onnxruntime")
    rows = list(run_predict("classify", str(distilbert_classifier), TEXTS, backend=backend))
    pipe = transformers.pipeline("text-classification", model=str(distilbert_classifier), device="cpu", top_k=None)
    for row, theirs in zip(rows, pipe(TEXTS)):
        for item in theirs:
            assert row["scores"][item["label"]] == pytest.approx(item["score"], abs=1e-4 if backend != "torch" else 1e-5)


def test_jax_backend_refuses_the_family_by_name(roberta_dirs):
    pytest.importorskip("jax")
    from bertforge.errors import InputError

    for task in ("classify", "embed"):
        with pytest.raises(InputError, match="--backend jax has no Roberta"):
            list(run_predict(task, str(roberta_dirs["classifier"]), TEXTS, backend="jax"))


def test_inspect_counts_distilbert_parts(distilbert_classifier):
    from bertforge.interop.inspect import inspect_checkpoint

    report = inspect_checkpoint(distilbert_classifier)
    model = bertforge.AutoModelForSequenceClassification.from_pretrained(distilbert_classifier)
    counts = report["parameters"]
    assert counts["encoder"] == sum(p.numel() for p in model.distilbert.layers.parameters())
    assert counts["heads"] == sum(p.numel() for n, p in model.named_parameters() if "classifier" in n)
    assert counts["pooler"] == 0 and counts["total"] == model.num_parameters()
    assert report["heads"] == ["classifier"] and report["missing_keys"] == [] == report["unexpected_keys"]


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_squad_spans_round_trip_through_the_family_tokenizers(kind, unigram_dirs):
    """gold answer -> token span -> text, over SQuAD v1.1 dev, with byte-level BPE and Unigram offsets, as
    `finetune qa` and the qa pipeline use them."""
    from conftest import shared
    from qa_utils import span_recovery

    from bertforge.data.qa import qa_features, read_squad

    examples, _ = read_squad(shared("squad", "dev-v1.1.json"))
    examples = examples[:1500]
    tok = (ByteLevelBPETokenizer.train(texts=corpus(), vocab_size=2000) if kind == "bpe"
           else bertforge.AutoTokenizer.from_pretrained(unigram_dirs / "hf"))
    inside, recovered, _ = span_recovery(examples, qa_features(examples, tok, 256, 64, training=True))
    assert inside > 1300 and recovered / inside >= 0.99, (inside, recovered / inside)


def test_sentence_transformers_directory_around_xlmr(unigram_dirs, tmp_path):
    """A multilingual embedder's layout (XLM-R + CLS pooling + Normalize, saved by sentence-transformers):
    bertforge's embeddings are sentence-transformers' own."""
    st = pytest.importorskip("sentence_transformers")
    from sentence_transformers import models as st_models

    tok_dir = unigram_dirs / "hf"
    vocab = json.loads((tok_dir / "tokenizer.json").read_text())["model"]["vocab"]
    config = transformers.XLMRobertaConfig(vocab_size=len(vocab), **SIZES)
    torch.manual_seed(2)
    perturbed(transformers.XLMRobertaModel(config)).save_pretrained(tmp_path / "hf")
    for f in tok_dir.iterdir():
        (tmp_path / "hf" / f.name).write_bytes(f.read_bytes())
    word = st_models.Transformer(str(tmp_path / "hf"), max_seq_length=48)
    model = st.SentenceTransformer(modules=[word, st_models.Pooling(word.get_word_embedding_dimension(), "cls"),
                                            st_models.Normalize()], device="cpu")
    model.save(str(tmp_path / "st"))
    ours = torch.tensor([row["embedding"] for row in run_predict("embed", str(tmp_path / "st"), TEXTS, backend="torch")])
    theirs = st.SentenceTransformer(str(tmp_path / "st"), device="cpu").encode(TEXTS, convert_to_tensor=True)
    torch.testing.assert_close(ours, theirs.float(), atol=1e-5, rtol=0)


def test_inspect_reads_every_family_member_and_head_in_text_and_json(tmp_path):
    """`bertforge inspect` (text and --json) on every head of every family member; DistilBERT's config.json names
    its sizes n_layers and dim, and the text report used to die on a KeyError there."""
    import subprocess
    import sys

    from bertforge.interop.inspect import format_report, inspect_checkpoint
    from bertforge.models.registry import FAMILIES

    for model_type, row in FAMILIES.items():
        config = row.config.from_preset("L2-H64", vocab_size=100, pad_token_id=1 if model_type == "mpnet" else 0)
        for info in row.heads:
            folder = tmp_path / f"{model_type}-{info.kind}"
            info.cls(config).save_pretrained(folder)
            report = inspect_checkpoint(folder)
            assert report["missing_keys"] == [] and not report["non_finite"], (model_type, info.kind)
            ffn = config.intermediate_size  # 4H, ModernBERT's GeGLU 1.5H
            assert report["size"] == {"layers": 2, "hidden": 64, "heads": 1, "ffn": ffn, "vocab": 100,
                                      "max_len": config.max_position_embeddings}, (model_type, info.kind)
            assert f"size          L=2 H=64 heads=1 FFN={ffn} vocab=100" in format_report(report)
    for args in ([], ["--json"]):  # the command itself, on DistilBERT's classifier: its exit code and its output
        folder = tmp_path / "distilbert-sequence-classification"
        run = subprocess.run([sys.executable, "-m", "bertforge", "inspect", str(folder), *args],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
        assert (json.loads(run.stdout)["size"]["layers"] == 2) if args else ("L=2 H=64" in run.stdout)


def test_camembert_classifies_and_embeds_as_the_references(camembert_dirs, tmp_path):
    """CamemBERT (RoBERTa's network, its own tokenizer numbering): classify probabilities equal transformers', embed
    equals sentence-transformers', and the fused path gives torch's numbers."""
    tok_dir = camembert_dirs / "hf"
    vocab = json.loads((tok_dir / "tokenizer.json").read_text())["model"]["vocab"]
    labels = {"id2label": {0: "neg", 1: "pos"}, "label2id": {"neg": 0, "pos": 1}}
    config = transformers.CamembertConfig(vocab_size=len(vocab), **SIZES, **labels)
    torch.manual_seed(2)
    perturbed(transformers.CamembertForSequenceClassification(config)).save_pretrained(tmp_path)
    for f in tok_dir.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    texts = TEXTS + ["Le film était <mask> , vraiment ."]
    rows = list(run_predict("classify", str(tmp_path), texts, backend="torch"))
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        probs = model(**tok(texts, padding=True, return_tensors="pt")).logits.softmax(-1)
    assert [r["scores"]["pos"] for r in rows] == pytest.approx(probs[:, 1].tolist(), abs=1e-5)
    fused = list(run_predict("classify", str(tmp_path), texts, backend="fused"))
    assert [r["scores"]["pos"] for r in fused] == pytest.approx(probs[:, 1].tolist(), abs=1e-4)
    assert_embeds_as_sentence_transformers(tmp_path, texts)
