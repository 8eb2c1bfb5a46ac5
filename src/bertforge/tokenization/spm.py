"""SentencePiece's own files: training a Unigram vocabulary, and reading a `.model` file.

Both go through the `sentencepiece` library (its trainer, and the `ModelProto` it ships, parsed with
protobuf), installed by the `sentencepiece` extra. What they give back is what the `tokenizers`
library runs: (piece, score) pairs and the precompiled normalisation map. `unigram.py` turns those
into XLM-R's or ALBERT's pipeline.

Why SentencePiece's trainer and not the `tokenizers` one: the `tokenizers` Unigram trainer gives a
different vocabulary on each run of the same text (its seed pieces come out of a hash map in
process-random order); SentencePiece's, on one thread, gives the same model bytes every time.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..errors import TokenizerError, require

# SentencePiece piece types (sentencepiece_model.proto): what each piece of a .model file is.
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


@dataclass(frozen=True)
class SentencePieceModel:
    """pieces: (piece, score, type) in id order; charsmap: the precompiled normaliser (b"" for none);
    unk_id: the unknown piece's id."""

    pieces: list[tuple[str, float, int]]
    charsmap: bytes
    unk_id: int


def _proto():
    require("sentencepiece", "sentencepiece", "google.protobuf", what="SentencePiece vocabularies")
    from sentencepiece import sentencepiece_model_pb2

    return sentencepiece_model_pb2


def read_model(file: Path) -> SentencePieceModel:
    """Parse a SentencePiece `.model` file (spiece.model, sentencepiece.bpe.model); refuse BPE models and
    byte fallback, which the Unigram pipelines here do not run."""
    proto = _proto().ModelProto()
    try:
        proto.ParseFromString(file.read_bytes())
    except Exception as exc:  # protobuf raises its own DecodeError, or RuntimeWarning-like errors on garbage
        raise TokenizerError(f"{file}: not a SentencePiece model ({type(exc).__name__}: {exc})") from None
    if not proto.pieces:
        raise TokenizerError(f"{file}: not a SentencePiece model (no pieces)")
    if proto.trainer_spec.model_type != proto.trainer_spec.UNIGRAM:
        kind = proto.trainer_spec.ModelType.Name(proto.trainer_spec.model_type)
        raise TokenizerError(f"{file}: a SentencePiece {kind} model; bertforge reads Unigram models")
    if proto.trainer_spec.byte_fallback:
        raise TokenizerError(f"{file}: uses byte fallback, which bertforge's Unigram tokenizers do not implement")
    pieces = [(p.piece, p.score, p.type) for p in proto.pieces]
    return SentencePieceModel(pieces, proto.normalizer_spec.precompiled_charsmap, proto.trainer_spec.unk_id)


def train_unigram(texts: Iterable[str], vocab_size: int, specials: list[str],
                  unk: str = "<unk>") -> tuple[list[tuple[str, float]], bytes]:
    """A Unigram vocabulary of about `vocab_size` pieces: `specials` first (score 0; `unk`, the unknown
    piece, among them), then SentencePiece's
    pieces, best first. Returns (vocab, precompiled charsmap of SentencePiece's NFKC rules).

    One thread and no sampling, so the same text gives the same vocabulary, byte for byte. The size is
    a soft limit (SentencePiece's `hard_vocab_limit: false`): a small corpus gets fewer pieces.
    """
    if unk not in specials:
        raise TokenizerError(f"a Unigram vocabulary needs an {unk} piece among its special tokens")
    _proto()
    import sentencepiece

    model = io.BytesIO()
    rows = (line for line in texts if line.strip())
    try:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=rows, model_writer=model, model_type="unigram",
            vocab_size=max(vocab_size - len(specials) + 1, 8), hard_vocab_limit=False,
            # Only <unk> is SentencePiece's own; the family's specials are put in front below.
            unk_id=0, unk_piece=unk, bos_id=-1, eos_id=-1, pad_id=-1,
            num_threads=1, input_sentence_size=0, max_sentence_length=1 << 20, minloglevel=2)
    except RuntimeError as exc:
        raise TokenizerError(f"SentencePiece could not train a vocabulary: {exc}") from None
    proto = _proto().ModelProto()
    proto.ParseFromString(model.getvalue())
    learned = [(p.piece, p.score) for p in proto.pieces if p.type == NORMAL and p.piece not in specials]
    return [(token, 0.0) for token in specials] + learned, proto.normalizer_spec.precompiled_charsmap
