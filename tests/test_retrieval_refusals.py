"""Right or refused, part 4: the retrieval commands and hostile model directories and requests.

One test per class of issue #72, each through the CLI or a real server as the user meets it, and each failing
on the code before the fix: settings a sentence-transformers directory carries, training that cannot learn,
empty texts, run files that judge nothing, CSV records across lines, a set its own reader refuses, files lost on a
full disk or to --overwrite, outputs that are inputs, tracebacks for a user's mistake, and hostile configs,
tokenizers and request bodies.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import pytest
import torch

st = pytest.importorskip("sentence_transformers")
import sentence_transformers.models  # noqa: E402,F401
transformers = pytest.importorskip("transformers")

from bertforge.cli import main  # noqa: E402
from bertforge.data.retrieval import read_tuples  # noqa: E402
from conftest import tiny_modernbert  # noqa: E402
from disk_utils import small_disk  # noqa: E402
from cli_utils import snapshot  # noqa: E402


def refused(capsys, args: list[str], *words: str) -> str:
    """Run `bertforge ARGS` in this process: exit 2, one line on stderr holding every word, no traceback."""
    capsys.readouterr()
    code = main(args)
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines()  # warnings and progress lines are not the refusal
             if "WARNING" not in line and not line.startswith(("predict:", "precision:", "train:"))]
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.fixture()
def root(retrieval_dirs) -> Path:
    return retrieval_dirs


def _embed(root: Path, out: Path, *flags: str, train: str = "pairs.jsonl") -> list[str]:
    return ["finetune", "embed", "--model", str(root / "st"), "--train", str(root / train), "--dev",
            str(root / "beir"), "--batch-size", "8", "--max-steps", "2", "--precision", "fp32", "--matmul", "torch",
            "--out", str(out), "--json", *flags]


def _copy_beir(root: Path, to: Path) -> Path:
    shutil.copytree(root / "beir", to)
    return to


# ------------------------------------------------------------------ 1. a directory's own settings are kept
def test_a_sentence_transformers_directorys_prompts_and_similarity_are_kept(tmp_path, root, capsys):
    from bertforge.settings import EmbedConfig
    from bertforge.tasks.embedding import build
    from bertforge.tokenization.kinds import load_tokenizer

    own = json.loads((root / "st" / "config_sentence_transformers.json").read_text())["prompts"]
    assert own["query"] == "query: " and own["passage"] == "passage: "  # (sentence-transformers 6 adds "document": "")
    assert main(_embed(root, tmp_path / "kept")) == 0
    saved = json.loads((tmp_path / "kept" / "config_sentence_transformers.json").read_text())
    assert saved["prompts"] == own
    assert saved["similarity_fn_name"] == "dot"
    # --query-prompt alone changes that prompt, keeps the other, and says so.
    capsys.readouterr()
    assert main(_embed(root, tmp_path / "one", "--query-prompt", "q: ")) == 0
    assert "--query-prompt 'q: ' replaces the model's prompt 'query' ('query: ')" in capsys.readouterr().err
    saved = json.loads((tmp_path / "one" / "config_sentence_transformers.json").read_text())
    assert saved["prompts"] == {**own, "query": "q: "}
    assert main(_embed(root, tmp_path / "pool", "--pooling", "cls")) == 0  # replacing the pooling is said too
    assert "--pooling cls replaces the model's pooling mean" in capsys.readouterr().err
    # The prompts are applied in training and in the dev evaluation: each side's ids begin with its prompt.
    cfg = EmbedConfig(model=str(root / "st"), train=str(root / "pairs.jsonl"), dev=str(root / "beir"),
                      out=str(tmp_path / "x"), max_steps=1)
    tok = load_tokenizer(str(root / "st"))
    _, task = build(cfg, tok, cfg.train, cfg.dev)
    assert task.similarity == "dot"
    for text, query, prompt in (("a cat", True, "query: "), ("a dog", False, "passage: ")):
        assert task.features([text], query)[0]["input_ids"] == tok([prompt + text])["input_ids"][0]


# ------------------------------------------------------------------ 2. training that cannot learn
@pytest.mark.parametrize("command", ["embed", "rerank", "colbert"])
def test_pairs_at_batch_size_one_are_refused(tmp_path, root, capsys, command):
    args = {"embed": _embed(root, tmp_path / "o", "--batch-size", "1"),
            "rerank": ["finetune", "rerank", "--model", str(root / "cross"), "--train", str(root / "pairs.jsonl"),
                       "--dev", str(root / "beir"), "--candidates", str(root / "run.trec"), "--batch-size", "1",
                       "--max-steps", "2", "--out", str(tmp_path / "o")],
            "colbert": ["finetune", "colbert", "--model", str(root / "bert"), "--train", str(root / "pairs.jsonl"),
                        "--dev", str(root / "beir"), "--batch-size", "1", "--dim", "8", "--max-steps", "2",
                        "--out", str(tmp_path / "o")]}[command]
    refused(capsys, args, "--batch-size 1", "no negative", "loss 0")
    # A hard negative column gives each row its own negative: then one row a batch trains.
    if command == "embed":
        assert main(_embed(root, tmp_path / "t", "--batch-size", "1", train="triplets.jsonl")) == 0


# ------------------------------------------------------------------ 3. empty texts in a BEIR folder
@pytest.mark.parametrize("file, line, record", [("queries.jsonl", 3, {"_id": "q2", "text": ""}),
                                                ("corpus.jsonl", 5, {"_id": "d4", "title": "", "text": " \t "})])
def test_empty_texts_in_a_beir_folder_are_refused_by_line(tmp_path, root, capsys, file, line, record):
    beir = _copy_beir(root, tmp_path / "beir")
    lines = (beir / file).read_text().splitlines()
    lines[line - 1] = json.dumps(record)
    (beir / file).write_text("\n".join(lines) + "\n")
    args = _embed(root, tmp_path / "o")
    args[args.index("--train") + 1] = str(beir)
    refused(capsys, args, f"{file}:{line}", "empty text")


# ------------------------------------------------------------------ 4. a run file that judges nothing
def test_a_run_that_ranks_no_judged_query_or_holds_nan_is_refused(tmp_path, root, capsys):
    other = tmp_path / "other.trec"
    other.write_text("".join(f"z{q} Q0 d{q} 1 1.0 first\n" for q in range(3)))
    args = ["evaluate", "rerank", "--model", str(root / "cross"), "--data", str(root / "beir"), "--split", "dev",
            "--candidates", str(other)]
    refused(capsys, args, str(other), "ranks none of the 8 judged queries")
    nan = tmp_path / "nan.trec"
    nan.write_text((root / "run.trec").read_text().replace(" 0.9 first", " nan first", 1))
    args[args.index("--candidates") + 1] = str(nan)
    refused(capsys, args, f"{nan}:2", "'nan' is not a finite number")


# ------------------------------------------------------------------ 5. CSV records across lines
def test_a_csv_field_keeps_its_newline_and_later_lines_their_numbers(tmp_path, root, capsys):
    good = tmp_path / "good.csv"
    good.write_text('query,positive\n"line one\nline two",a passage\nsecond,another passage\n')
    data = read_tuples(str(good))
    assert data.rows[0] == ("line one\nline two", "a passage") and data.lines == [2, 4]
    bad = tmp_path / "bad.csv"
    bad.write_text('query,positive\n"line one\nline two",a passage\nq2,p2\nq3,p3\nq4,\n')
    args = _embed(root, tmp_path / "o")
    args[args.index("--train") + 1] = str(bad)
    refused(capsys, args, f"{bad}:6", "'positive' is empty")


# ------------------------------------------------------------------ 6, 12. squad-retrieval checks its input first
def _squad(articles: int = 48, qas_per: int = 2) -> dict:
    return {"version": "1.1", "data": [
        {"title": f"a{a}", "paragraphs": [{"context": f"Paragraph {a} says something.",
                                            "qas": [{"id": f"{a}-{q}", "question": f"What does {a} say?",
                                                     "answers": [{"text": "something", "answer_start": 14}]}
                                                    for q in range(qas_per)]}]} for a in range(articles)]}


@pytest.mark.parametrize("fault, words", [("duplicate", ["data[7].paragraphs[0].qas[0]", "'3-0'", "also"]),
                                          ("no qas", ["data[5].paragraphs[0]", "no 'qas' list"])])
def test_squad_retrieval_refuses_what_its_reader_would_and_writes_nothing(tmp_path, capsys, fault, words):
    squad = _squad()
    if fault == "duplicate":
        squad["data"][7]["paragraphs"][0]["qas"][0]["id"] = "3-0"
    else:
        del squad["data"][5]["paragraphs"][0]["qas"]
    file = tmp_path / "squad.json"
    file.write_text(json.dumps(squad))
    refused(capsys, ["squad-retrieval", str(file), "--out", str(tmp_path / "set")], *words)
    assert not (tmp_path / "set").exists()


def test_squad_retrievals_set_reads_back(tmp_path, capsys):
    from bertforge.retrieval.beir import read_beir

    file = tmp_path / "squad.json"
    file.write_text(json.dumps(_squad()))
    assert main(["squad-retrieval", str(file), "--out", str(tmp_path / "set")]) == 0
    for split in ("train", "dev", "test"):
        assert read_beir(tmp_path / "set", split).qrels


# ------------------------------------------------------------------ 7. a full disk keeps the previous file
def test_a_full_disk_keeps_the_previous_run_file_and_set(tmp_path, root, capsys):
    with small_disk(tmp_path, "1M") as disk:
        old_run = disk / "run.trec"
        old_run.write_text("the user's previous run\n")
        squad = tmp_path / "squad.json"
        squad.write_text(json.dumps(_squad()))
        assert main(["squad-retrieval", str(squad), "--out", str(disk / "set")]) == 0
        before = snapshot(disk / "set")
        filler = disk / "filler"
        with open(filler, "wb") as f:  # fill the disk to the last block
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass
        for chunk in (4096, 1):
            try:
                with open(filler, "ab") as f:
                    while True:
                        f.write(b"\0" * chunk)
                        f.flush()
            except OSError:
                pass
        refused(capsys, ["evaluate", "retrieval", "--model", str(root / "st"), "--data", str(root / "beir"),
                         "--split", "dev", "--run", str(old_run), "--overwrite"],
                str(old_run), "No space left on device", "the previous run.trec is intact")
        assert old_run.read_text() == "the user's previous run\n"
        squad.write_text(json.dumps(_squad(qas_per=3)))  # a larger set: its files cannot fit
        refused(capsys, ["squad-retrieval", str(squad), "--out", str(disk / "set"), "--overwrite"],
                "No space left on device", "intact")
        assert snapshot(disk / "set") == before
        assert not [p for p in (disk / "set").rglob(".*.tmp")]


# ------------------------------------------------------------------ 8, 9. the user's files are never replaced
def test_overwrite_never_replaces_a_users_readme_and_replaces_its_own_card(tmp_path, root, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "README.md").write_text("# my notes\n")
    refused(capsys, _embed(root, out, "--overwrite"), "README.md", "not a model card bertforge wrote")
    assert (out / "README.md").read_text() == "# my notes\n"
    (out / "README.md").unlink()
    assert main(_embed(root, out, "--overwrite")) == 0
    first = (out / "README.md").read_text()
    assert main(_embed(root, out, "--overwrite")) == 0  # its own card: replaced
    assert (out / "README.md").read_text() == first


def test_mine_refuses_an_out_that_is_its_input(tmp_path, root, capsys):
    data = tmp_path / "pairs.jsonl"
    shutil.copy(root / "pairs.jsonl", data)
    before = data.read_bytes()
    refused(capsys, ["mine", "--model", str(root / "st"), "--data", str(data), "--out", str(data), "--overwrite"],
            "--out", "is the --data input", "destroy")
    beir = _copy_beir(root, tmp_path / "beir")
    refused(capsys, ["mine", "--model", str(root / "st"), "--data", str(beir), "--out", str(beir / "corpus.jsonl"),
                     "--overwrite"], "is a file of the --data input")
    assert data.read_bytes() == before


# ------------------------------------------------------------------ 10, 11. one line, before any work
@pytest.mark.parametrize("command", ["evaluate retrieval", "evaluate rerank", "mine"])
def test_bad_output_paths_and_counts_are_refused_before_any_work(tmp_path, root, capsys, command):
    model = root / ("cross" if command == "evaluate rerank" else "st")
    base = [*command.split(), "--model", str(model), "--data", str(root / "beir")]
    base += {"evaluate retrieval": ["--split", "dev"], "evaluate rerank": ["--split", "dev", "--candidates",
                                                                           str(root / "run.trec")],
             "mine": ["--split", "train"]}[command]
    flag = "--out" if command == "mine" else "--run"
    started = time.perf_counter()
    refused(capsys, [*base, flag, str(tmp_path / "nodir" / "x.out")], flag, "nodir", "does not exist")
    refused(capsys, [*base, flag, str(tmp_path)], flag, "is a folder")
    extra = [flag, str(tmp_path / "x.out")] if command == "mine" else []
    refused(capsys, [*base, *extra, "--batch-size", "0"], "--batch-size 0", "at least 1")
    assert time.perf_counter() - started < 10  # refused before the model loads and the corpus is embedded


# ------------------------------------------------------------------ 13. a Dense module of another model
def test_a_dense_module_of_another_width_is_refused_in_one_line(tmp_path, root, capsys):
    model = tmp_path / "st"
    modules = [st.models.Transformer(str(root / "bert"), max_seq_length=48), st.models.Pooling(32, "mean"),
               st.models.Dense(32, 16)]
    st.SentenceTransformer(modules=modules, device="cpu").save(str(model))
    dense = json.loads((model / "2_Dense" / "config.json").read_text())
    from safetensors.torch import load_file, save_file

    weights = load_file(model / "2_Dense" / "model.safetensors")
    weights["linear.weight"] = torch.zeros(16, 24)
    save_file(weights, model / "2_Dense" / "model.safetensors")
    (model / "2_Dense" / "config.json").write_text(json.dumps({**dense, "in_features": 24}))
    refused(capsys, ["predict", "embed", "--model", str(model), "a text"], "in_features 24", "vectors of 32")
    refused(capsys, ["evaluate", "retrieval", "--model", str(model), "--data", str(root / "beir"), "--split", "dev"],
            "in_features 24")


# ------------------------------------------------------------------ 14. a checkpoint that holds code
class _Code:
    def __reduce__(self):
        return (print, ("this ran",))


def test_a_training_state_that_holds_code_is_refused_in_one_line(tmp_path, run_inputs, capsys):
    corpus, tok = run_inputs
    out = tmp_path / "run"
    args = ["pretrain", str(corpus), "--tokenizer", str(tok), "--model", "L2-H64", "--seq-len", "32",
            "--batch-size", "8", "--workers", "1", "--precision", "fp32", "--matmul", "torch", "--out", str(out)]
    assert main([*args, "--max-steps", "4", "--save-every", "2", "--json"]) == 0
    state = sorted((out / "checkpoints").iterdir())[-1] / "training_state.pt"
    torch.save({"optimizer": _Code(), "torch_rng": torch.get_rng_state()}, state)
    refused(capsys, [*args, "--max-steps", "6", "--resume"], str(state), "refused to load", "could run code")
    assert "this ran" not in capsys.readouterr().out


# ------------------------------------------------------------------ 15. a config.json that asks for the impossible
@pytest.mark.parametrize("change, words", [({"hidden_size": 10_000_000, "num_attention_heads": 10},
                                            ["config.json does not match the weights", "(10000000,)"]),
                                           ({"num_hidden_layers": 1_000_000},
                                            ["asks for", "num_hidden_layers 1000000", "the weights hold"])])
def test_an_impossible_config_is_refused_before_the_model_is_built(tmp_path, root, capsys, change, words):
    model = tmp_path / "m"
    shutil.copytree(root / "bert", model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, **change}))
    started = time.perf_counter()
    refused(capsys, ["predict", "embed", "--model", str(model), "a text"], *words)
    assert time.perf_counter() - started < 10


# ------------------------------------------------------------------ 16-18. hostile tokenizers and request bodies
@pytest.fixture(scope="module")
def slow_server(tmp_path_factory, modern_dirs):
    """A tiny ModernBERT whose tokenizer.json (read as it is, as PreTrainedTokenizerFast) splits on a backtracking
    regular expression, served with a 2 s bound on each request."""
    pytest.importorskip("fastapi")
    from server_utils import running_server

    model = tiny_modernbert(tmp_path_factory.mktemp("slow"), modern_dirs, 512)
    spec = json.loads((model / "tokenizer.json").read_text())
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "(a|a)+b"}, "behavior": "Isolated", "invert": False},
        spec["pre_tokenizer"]]}
    (model / "tokenizer.json").write_text(json.dumps(spec))
    with running_server(model, "--request-timeout-s", "2", "--max-chars", "200000", "--backend", "torch") as (port, _):
        yield port


def test_a_stalling_tokenizer_never_blocks_health_and_a_stuck_request_is_answered(slow_server):
    from server_utils import call

    slow = ("a" * 17 + " ") * 3000  # about 15 s of backtracking on a 2-core EPYC
    answers = []
    worker = threading.Thread(target=lambda: answers.append(call(slow_server, "/embed", {"inputs": slow,
                                                                                      "truncate": True})))
    started = time.perf_counter()
    worker.start()
    time.sleep(0.3)
    waits = []
    for _ in range(5):
        began = time.perf_counter()
        assert call(slow_server, "/health")[0] == 200
        waits.append(time.perf_counter() - began)
        time.sleep(0.2)
    worker.join(60)
    assert max(waits) < 1.0, waits  # it waited ~4.4 s when tokens were counted on the event loop
    status, body = answers[0]
    assert status == 503 and "--request-timeout-s" in body["error"], body
    assert time.perf_counter() - started < 6
    # Input the expression gives up on (its retry limit) is one 422 naming the tokenizer, and the server goes on.
    deadline = time.time() + 60
    while True:  # the stuck tokenising ends by itself; then a plain request is answered
        status, body = call(slow_server, "/embed", {"inputs": "a plain sentence"})
        if status == 200 or time.time() > deadline:
            break
        time.sleep(1)
    assert status == 200, body
    status, body = call(slow_server, "/embed", {"inputs": "a" * 300})
    assert status == 422 and "cannot encode the input" in body["error"], body
    assert call(slow_server, "/embed", {"inputs": "still serving"})[0] == 200


def _post(port: int, path: str, body: dict) -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    from conftest import SERVE_KEY

    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {SERVE_KEY}"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_token_ids_are_embedded_as_tei_does_and_wrong_shapes_are_named_in_a_clients_words(embedder):
    status, by_text = _post(embedder, "/embed", {"inputs": "hello"})
    assert status == 200
    for inputs in ([101, 7592, 102], [[101, 7592, 102]]):  # [CLS] hello [SEP], one input or a batch
        status, by_ids = _post(embedder, "/embed", {"inputs": inputs})
        assert status == 200 and torch.allclose(torch.tensor(by_ids), torch.tensor(by_text), atol=1e-5)
    for path, body, expected in [
            ("/embed_all", {"inputs": [[101, 7592, 102]]}, "inputs is a list of lists (token ids, or text pairs); "
                                                           "this route takes one text or a list of texts"),
            ("/v1/rerank", {"query": "q", "documents": ["a", {"texte": "b"}]}, "documents[1].text is required")]:
        status, answer = _post(embedder, path, body)
        message = answer.get("error") or answer.get("message")
        assert status in (400, 422) and message.startswith(expected), answer
        for internal in ("dialect", "lambda", "constrained-str", "Input tag"):
            assert internal not in message, message


def test_a_long_rerank_query_is_named_as_the_query(tmp_path, cross_encoder):
    pytest.importorskip("fastapi")
    from server_utils import call, running_server

    with running_server(cross_encoder, "--max-chars", "10000") as (port, _):
        status, body = call(port, "/rerank", {"query": "q" * 12000, "texts": ["a"]})
        assert status == 413 and body["error"].startswith("query has 12000 characters"), body
        status, body = call(port, "/rerank", {"query": "q", "texts": ["a", "t" * 12000]})
        assert status == 413 and body["error"].startswith("texts[1] has 12000 characters"), body
