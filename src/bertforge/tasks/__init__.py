"""Fine-tuning tasks, one module each: its reader, features, task spec (how batches are made and
scored), head and metric. `TASKS` maps a task name to its `build(cfg, tokenizer, train, dev, model)`,
which returns (model, task) for the one training loop. Pretraining is `pretraining.build`, which
takes prepared shards instead of labelled files.

Adding a task means adding a module here and one line in `TASKS` (and its name in
`runconfig.TASKS`, which the CLI reads without importing torch).
"""

from __future__ import annotations

from ..data.batching import collate
from . import classification, colbert, embedding, question_answering, reranking, sparse, token_classification
from .base import FeatureTask, new_model
from .classification import ClassificationTask
from .question_answering import QuestionAnsweringTask
from .token_classification import TokenClassificationTask

TASKS = {
    "classify": classification.build,
    "regress": classification.build,
    "ner": token_classification.build,
    "qa": question_answering.build,
    "embed": embedding.build,
    "rerank": reranking.build,
    "sparse": sparse.build,
    "colbert": colbert.build,
}

__all__ = ["TASKS", "FeatureTask", "ClassificationTask", "TokenClassificationTask", "QuestionAnsweringTask",
           "new_model", "collate"]
