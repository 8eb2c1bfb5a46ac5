"""The losses bertforge trains with: one file per kind of loss, one table of them (`registry.py`).

- `in_batch.py`: each anchor against every candidate of the (global) batch (MultipleNegativesRankingLoss);
- `scored_pairs.py`: pairs with a similarity score (CoSENTLoss, CosineSimilarityLoss);
- `distillation.py`: a teacher's scores (MarginMSELoss, DistillKLDivLoss);
- `late_interaction.py`: PyLate's ColBERT losses over MaxSim scores;
- `cross_encoder.py`: a reranker's logits (binary cross-entropy, in-batch negatives, MarginMSE, ListNet).
"""

from .registry import (LOSSES, ROWS, SCORED_PAIRS, SCORED_TUPLES, Loss, check_negatives, data_kind, help_line,
                       losses_of, resolve)

__all__ = ["LOSSES", "ROWS", "SCORED_PAIRS", "SCORED_TUPLES", "Loss", "check_negatives", "data_kind", "help_line",
           "losses_of", "resolve"]
