"""RoBERTa's byte-level BPE (GPT-2's byte alphabet, `Ġ` for a leading space), read from vocab.json + merges.txt or
tokenizer.json, and trained with `tokenizers`' BPE trainer; the shared parts are `subword.py`'s.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tokenizers import decoders, models, pre_tokenizers, processors, trainers
from tokenizers import Tokenizer as Backend

from ..errors import TokenizerError
from ..jsonfile import read_json_object
from .subword import TRAINED_SPECIALS, SubwordTokenizer

class ByteLevelBPETokenizer(SubwordTokenizer):
    """RoBERTa's tokenizer: GPT-2's byte-level BPE (every byte has a symbol, so nothing is unknown), pairs as
    `<s> A </s></s> B </s>`, offsets trimmed of the spaces that byte-level symbols carry."""

    kind, model_type, transformers_class = "byte-level BPE", "BPE", "RobertaTokenizer"
    classes = {"RobertaTokenizer", "RobertaTokenizerFast"}
    default_prefix_space = False
    needs_prefix_space_for_words = True

    @classmethod
    def _backend_from_spec(cls, model: dict[str, Any], source: Path) -> Backend:
        vocab, merges = model.get("vocab"), model.get("merges")
        if not isinstance(vocab, dict) or not isinstance(merges, list):
            raise TokenizerError(f"{source}: a BPE model needs 'vocab' (token -> id) and 'merges'")
        pairs = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in merges]
        return cls._bpe(vocab, pairs)

    @classmethod
    def _backend_from_files(cls, path: Path) -> Backend:
        vocab_file, merges_file = path / "vocab.json", path / "merges.txt"
        if not (vocab_file.is_file() and merges_file.is_file()):
            raise TokenizerError(f"{path}: no tokenizer.json, nor vocab.json with merges.txt")
        vocab = read_json_object(vocab_file, TokenizerError)
        lines = merges_file.read_text(encoding="utf-8").splitlines()
        pairs = [tuple(line.split(" ", 1)) for line in lines if line and not line.startswith("#version")]
        bad = next((i for i, p in enumerate(pairs) if len(p) != 2), None)
        if bad is not None:
            raise TokenizerError(f"{merges_file}: a merge is two tokens separated by a space")
        return cls._bpe(vocab, pairs)

    @staticmethod
    def _bpe(vocab: dict[str, int], merges: list[tuple[str, str]]) -> Backend:
        # transformers' RobertaTokenizer builds exactly this model: no unknown token, no dropout, no affixes.
        return Backend(models.BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                                  end_of_word_suffix="", fuse_unk=False))

    @classmethod
    def _pipeline(cls, backend: Backend, settings: dict[str, Any], normalizer_spec: dict | None) -> None:
        backend.normalizer = None
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=settings["add_prefix_space"])
        backend.decoder = decoders.ByteLevel()
        specials = settings["specials"]
        sep, cls_token = specials["sep_token"], specials["cls_token"]
        backend.post_processor = processors.RobertaProcessing(
            (sep, backend.token_to_id(sep)), (cls_token, backend.token_to_id(cls_token)),
            trim_offsets=settings["trim_offsets"], add_prefix_space=settings["add_prefix_space"])

    def _config_extra(self) -> dict[str, Any]:
        return {"trim_offsets": self.settings["trim_offsets"], "errors": "replace"}

    saved_files = SubwordTokenizer.saved_files + ("vocab.json", "merges.txt")

    def _save_vocabulary(self, path: Path) -> None:
        self.backend.model.save(str(path))  # vocab.json and merges.txt, for tools that read those

    @classmethod
    def train(cls, files: Iterable[str | Path] | None = None, vocab_size: int = 50265, min_frequency: int = 2,
              texts: Iterable[str] | None = None, show_progress: bool = False) -> "ByteLevelBPETokenizer":
        """Train a byte-level BPE vocabulary (`<s>`=0 `<pad>`=1 `</s>`=2 `<unk>`=3 `<mask>`=4, as RoBERTa's)."""
        backend = cls._bpe({}, [])
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=TRAINED_SPECIALS,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=show_progress)
        return cls._trained(backend, trainer, files, texts)


