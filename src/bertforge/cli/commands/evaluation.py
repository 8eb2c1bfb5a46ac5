"""Commands that score: evaluate TASK, evaluate retrieval and rerank, and score (prediction files you already have)."""

from __future__ import annotations

from ...safefiles import check_output_file
from ...tasks import TASKS
from ..build import command
from .apps import at_least_one, evaluate_app, score_app, show


def _evaluate_command(task: str) -> None:
    def evaluate(*, model: str, data: str, predictions: str | None = None, seq_len: int | None = None,
                 batch_size: int = 32, text_column: str | None = None, pair_column: str | None = None,
                 label_column: str | None = None, overwrite: bool = False, json: bool = False) -> None:
        from ...data.classification import Columns
        from ...training.finetune import run_evaluate

        at_least_one(batch_size=batch_size)
        if predictions:
            check_output_file(predictions, "--predictions", overwrite, {"--model": model, "--data": data})
        metrics = run_evaluate(task, model, data, seq_len=seq_len, batch_size=batch_size,
                               columns=Columns(text_column, pair_column, label_column), predictions=predictions)
        show(metrics, json, f"{task} on {data}")

    evaluate.__name__ = evaluate.__qualname__ = f"evaluate_{task}"
    evaluate.__doc__ = TASKS[task].evaluate + """

    Args:
        model: fine-tuned checkpoint directory
        data: labelled file in the task's format
        predictions: also write one JSON prediction per example to this file
        seq_len: maximum tokens per example (default 512; 384 for qa)
        batch_size: examples per forward pass
        text_column: column of the text (name or 0-based index)
        pair_column: column of the second text
        label_column: column of the label
        overwrite: replace an existing --predictions file
        json: print the metrics as one JSON object
    """
    command(evaluate_app, task)(evaluate)


for _task in (name for name, spec in TASKS.items() if spec.evaluate):
    _evaluate_command(_task)


@command(evaluate_app, "retrieval")
def evaluate_retrieval(*, model: str, data: str, split: str = "test", top_k: int = 100, batch_size: int = 64,
                       seq_len: int | None = None, query_prompt: str | None = None,
                       document_prompt: str | None = None, measures: str | None = None, run: str | None = None,
                       overwrite: bool = False, json: bool = False) -> None:
    """Search a corpus with an embedder and score the ranking as trec_eval does.

    Embeds every document of --data (a BEIR folder: corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv; or
    a file of (query, passage) pairs) and every judged query, retrieves each query's --top-k by
    exact search with the model's similarity function, and reports nDCG@10, MRR@10, MAP@100,
    Recall@1/10/100 and P@10 as trec_eval computes them. The model's prompts named for queries and
    documents (query/document, passage, search_query/search_document...) are applied.

    Args:
        model: a sentence-transformers directory, or any family checkpoint (mean pooling)
        data: a BEIR folder or a (query, passage) pair file (.jsonl, .tsv, .csv)
        split: the qrels split of a BEIR folder
        top_k: documents retrieved per query
        batch_size: texts per forward pass
        seq_len: maximum tokens per text (default: the model's max_seq_length)
        query_prompt: put before every query (default: the model's query prompt, if it has one)
        document_prompt: put before every document (default: the model's document prompt, if any)
        measures: comma-separated, e.g. ndcg@10,recall@100 (default: the list above)
        run: also write the ranking as a TREC run file here
        overwrite: replace an existing --run file
        json: print the metrics as one JSON object
    """
    from ...retrieval.evaluate import run_retrieval_evaluation

    at_least_one(batch_size=batch_size, top_k=top_k)
    if run:
        check_output_file(run, "--run", overwrite, {"--model": model, "--data": data})
    metrics = run_retrieval_evaluation(model, data, split=split, top_k=top_k, batch_size=batch_size, seq_len=seq_len,
                                       query_prompt=query_prompt, document_prompt=document_prompt,
                                       measures=measures, run_file=run)
    show(metrics, json, f"retrieval on {data}")


@command(evaluate_app, "rerank")
def evaluate_rerank(*, model: str, data: str, candidates: str, split: str = "test", top_k: int = 50,
                    batch_size: int = 32, measures: str | None = None, run: str | None = None,
                    overwrite: bool = False, json: bool = False) -> None:
    """Rerank a first stage's candidates with a cross-encoder and score both rankings as trec_eval does.

    Takes each judged query's first --top-k documents of --candidates (a TREC run file, e.g. from
    `evaluate retrieval --run`), scores every (query, document) pair with the cross-encoder, and
    reports the reranked ranking's measures beside the first stage's (`first_stage`).

    Args:
        model: a cross-encoder directory (one relevance logit; sentence-transformers' CrossEncoder layout too)
        data: a BEIR folder or a (query, passage) pair file
        candidates: the first stage's TREC run file
        split: the qrels split of a BEIR folder
        top_k: candidates reranked per query
        batch_size: pairs per forward pass
        measures: comma-separated, e.g. ndcg@10,recall@10 (default: nDCG@10, MRR@10, MAP@100, recall, P@10)
        run: also write the reranked ranking as a TREC run file here
        overwrite: replace an existing --run file
        json: print the metrics as one JSON object
    """
    from ...retrieval.rerank import run_rerank_evaluation

    at_least_one(batch_size=batch_size, top_k=top_k)
    if run:
        check_output_file(run, "--run", overwrite, {"--model": model, "--data": data, "--candidates": candidates})
    show(run_rerank_evaluation(model, data, candidates, split=split, top_k=top_k, batch_size=batch_size,
                               measures=measures, run_file=run), json, f"reranking on {data}")


@command(score_app, "squad")
def score_squad(data: str, predictions: str, *, na_probs: str | None = None, threshold: float = 1.0,
                json: bool = False) -> None:
    """SQuAD v1.1/v2.0 exact match and F1, as the official scripts compute them.

    DATA is the SQuAD file; PREDICTIONS maps question ids to answer text. Prints exact_match and
    f1 in percent (v2: the HasAns/NoAns splits too).

    Args:
        data: the SQuAD JSON file
        predictions: JSON of question id -> answer text
        na_probs: v2: JSON of question id -> no-answer probability
        threshold: v2: no-answer probability threshold
        json: print one JSON object instead of a summary
    """
    from ... import score

    show(score.score_squad(data, predictions, na_probs, threshold), json, f"SQuAD scores of {predictions}")


@command(score_app, "ner")
def score_ner(gold: str, pred: str, *, json: bool = False) -> None:
    """Entity-level precision, recall and F1 of two CoNLL files (conlleval's counting).

    GOLD and PRED are CoNLL column files with aligned tokens and the tag in the last column
    (IOB1, IOB2 or BIOES), or `evaluate --predictions` JSONL for PRED.

    Args:
        gold: CoNLL file with the gold tags
        pred: CoNLL file (or predictions JSONL) with the predicted tags
        json: print one JSON object instead of a summary
    """
    from ... import score

    show(score.score_ner(gold, pred), json, f"entity scores of {pred}")


@command(score_app, "classification")
def score_classification(gold: str, pred: str, *, json: bool = False) -> None:
    """Accuracy, macro-F1, binary F1 and MCC of two label files.

    GOLD and PRED hold one label per line (or as the last tab-separated column), or
    `evaluate --predictions` JSONL for PRED.

    Args:
        gold: file with the gold labels
        pred: file with the predicted labels
        json: print one JSON object instead of a summary
    """
    from ... import score

    show(score.score_classification(gold, pred), json, f"classification scores of {pred}")
