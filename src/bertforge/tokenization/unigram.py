"""SentencePiece Unigram tokenizers: XLM-RoBERTa's (fairseq's id layout), ALBERT's and DeBERTa-v2's, read from a
sentencepiece model file or tokenizer.json and trained with sentencepiece; the shared parts are `subword.py`'s.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

from tokenizers import decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as Backend

from ..errors import TokenizerError
from .settings import ALBERT_SPECIALS, DEBERTA_SPECIALS, read_sentence_settings
from .spm import SentencePieceModel, read_model, train_unigram
from .subword import TRAINED_SPECIALS, SubwordTokenizer

class UnigramTokenizer(SubwordTokenizer):
    """XLM-RoBERTa's tokenizer: a SentencePiece Unigram model with its normaliser, words marked with `▁`,
    pairs as `<s> A </s></s> B </s>`."""

    kind, model_type, transformers_class = "SentencePiece Unigram", "Unigram", "XLMRobertaTokenizer"
    classes = {"XLMRobertaTokenizer", "XLMRobertaTokenizerFast"}
    default_prefix_space = True
    _keeps_normalizer = True  # the SentencePiece normaliser (precompiled charsmap) is part of the model

    @classmethod
    def _backend_from_spec(cls, model: dict[str, Any], source: Path) -> Backend:
        vocab = model.get("vocab")
        if not isinstance(vocab, list) or not all(isinstance(v, list) and len(v) == 2 for v in vocab):
            raise TokenizerError(f"{source}: a Unigram model needs 'vocab' as [piece, score] pairs")
        return cls._unigram([(str(p), float(s)) for p, s in vocab], cls.unk_id)

    spm_file: ClassVar[str] = "sentencepiece.bpe.model"  # the SentencePiece model file of this family's checkpoints
    trained_specials: ClassVar[list[str]] = TRAINED_SPECIALS  # a new vocabulary's first pieces

    @classmethod
    def from_pretrained(cls, path: str | Path) -> "SubwordTokenizer":
        """tokenizer.json, or the SentencePiece model file alone (`sentencepiece.bpe.model`, ALBERT's `spiece.model`)."""
        path = Path(path)
        if path.is_dir() and not (path / "tokenizer.json").is_file() and (path / cls.spm_file).is_file():
            model = read_model(path / cls.spm_file)
            settings = read_sentence_settings(path, cls.classes, cls.default_prefix_space, cls.default_specials,
                                              cls.flags, cls.unused)
            backend = cls._unigram(cls._vocab_of(model), cls._unk_of(model))
            charsmap = {"type": "Precompiled", "precompiled_charsmap": base64.b64encode(model.charsmap).decode()}
            return cls._assemble(backend, settings, [], charsmap if model.charsmap else None, path)
        return super().from_pretrained(path)

    @classmethod
    def _vocab_of(cls, model: SentencePieceModel) -> list[tuple[str, float]]:
        """The vocabulary transformers' XLM-R tokenizer makes of a fairseq SentencePiece model: fairseq's four
        specials (<s> <pad> </s> <unk>) in place of SentencePiece's first three pieces, then <mask> at the end."""
        return ([(t, 0.0) for t in ("<s>", "<pad>", "</s>", "<unk>")] + [(p, s) for p, s, _ in model.pieces[3:]]
                + [("<mask>", 0.0)])

    @classmethod
    def _unk_of(cls, model: SentencePieceModel) -> int:
        """The unknown piece's id in the vocabulary `_vocab_of` makes: transformers fixes it per class."""
        return cls.unk_id

    @classmethod
    def _backend_from_files(cls, path: Path) -> Backend:
        raise TokenizerError(f"{path}: no tokenizer.json or {cls.spm_file}")

    @classmethod
    def train(cls, files: Iterable[str | Path] | None = None, vocab_size: int = 30000,
              texts: Iterable[str] | None = None, show_progress: bool = False) -> "UnigramTokenizer":
        """Train a SentencePiece Unigram vocabulary with SentencePiece's own trainer (`spm.py`): this pipeline's
        special tokens first (XLM-R: <s>=0 <pad> </s> <unk> <mask>), then the learned pieces, with SentencePiece's
        NFKC normaliser. The same text gives the same vocabulary, byte for byte."""
        vocab, charsmap = train_unigram(cls._stream(files, texts), vocab_size, cls.trained_specials,
                                        cls.default_specials["unk_token"])
        spec = {"type": "Precompiled", "precompiled_charsmap": base64.b64encode(charsmap).decode()}
        return cls._new(cls._unigram(vocab, cls.unk_id), spec)

    # transformers' XLMRobertaTokenizer fixes the unknown id at 3 (fairseq's <unk>); AlbertTokenizer at 1.
    unk_id: ClassVar[int] = 3

    @staticmethod
    def _unigram(vocab: list[tuple[str, float]], unk_id: int) -> Backend:
        return Backend(models.Unigram(vocab, unk_id=unk_id, byte_fallback=False))

    @classmethod
    def _normalizers(cls, settings: dict[str, Any]) -> list:
        """What runs before SentencePiece's own normaliser: nothing for XLM-R."""
        return []

    @classmethod
    def _pair_template(cls, bos: str, eos: str) -> tuple[list[str], list[str]]:
        """The single and pair templates: XLM-R's `<s> A </s>` and `<s> A </s></s> B </s>`."""
        return [bos, "$A", eos], [bos, "$A", eos, eos, "$B", eos]

    @classmethod
    def _pipeline(cls, backend: Backend, settings: dict[str, Any], normalizer_spec: dict | None) -> None:
        # transformers keeps SentencePiece's precompiled normaliser and nothing else of tokenizer.json's.
        charsmap = _precompiled_charsmap(normalizer_spec)
        from tokenizers import normalizers

        steps = cls._normalizers(settings) + ([normalizers.Precompiled(charsmap)] if charsmap is not None else [])
        backend.normalizer = normalizers.Sequence(steps) if len(steps) > 1 else (steps[0] if steps else None)
        scheme = "always" if settings["add_prefix_space"] else "never"
        backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                         pre_tokenizers.Metaspace(replacement="▁",
                                                                                  prepend_scheme=scheme)])
        backend.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=scheme)
        specials = settings["specials"]
        bos, eos = specials["cls_token"], specials["sep_token"]
        single, pair = cls._pair_template(bos, eos)
        backend.post_processor = processors.TemplateProcessing(
            single=single, pair=pair, special_tokens=[(bos, backend.token_to_id(bos)), (eos, backend.token_to_id(eos))])


class CamembertTokenizer(UnigramTokenizer):
    """CamemBERT's tokenizer: XLM-R's pipeline on fairseq's other numbering of a SentencePiece model. fairseq put
    its four specials in front of every SentencePiece piece (`<s>NOTUSED` `<pad>` `</s>NOTUSED` `<unk>`, then the
    model's own `<unk>` as `<unk>NOTUSED`, its `<s>` and `</s>` at 5 and 6, ...), where XLM-R's replaced the model's
    first three; `<mask>` comes last, taking the space before it, and the three NOTUSED pieces are special tokens."""

    kind, transformers_class = "SentencePiece Unigram (CamemBERT)", "CamembertTokenizer"
    classes = {"CamembertTokenizer", "CamembertTokenizerFast"}
    # A new vocabulary's first pieces: fairseq's layout, the model's own <s> and </s> at 5 and 6, then <mask>.
    trained_specials = ["<s>NOTUSED", "<pad>", "</s>NOTUSED", "<unk>", "<unk>NOTUSED", "<s>", "</s>", "<mask>"]
    unused = ("<s>NOTUSED", "</s>NOTUSED", "<unk>NOTUSED")

    @classmethod
    def _vocab_of(cls, model: SentencePieceModel) -> list[tuple[str, float]]:
        """transformers' CamemBERT vocabulary of a fairseq SentencePiece model: the five fixed pieces (the model's
        `<unk>` demoted to -100 so it is never chosen), every piece but the model's first, then `<mask>`."""
        return ([("<s>NOTUSED", 0.0), ("<pad>", 0.0), ("</s>NOTUSED", 0.0), ("<unk>", 0.0), ("<unk>NOTUSED", -100.0)]
                + [(p, s) for p, s, _ in model.pieces[1:]] + [("<mask>", 0.0)])

    @classmethod
    def _assemble(cls, backend: Backend, settings: dict[str, Any], added: list[dict[str, Any]],
                  normalizer_spec: dict | None, source: Path) -> "SubwordTokenizer":
        """XLM-R's assembly, plus what transformers' CamembertTokenizer adds where tokenizer.json does not declare them:
        the mask token takes the space before it, and the NOTUSED pieces are special (typed in text, each is one
        token). A declared token keeps its file's flags."""
        declared = {t.get("content") for t in added}
        mask = settings["specials"]["mask_token"]
        extra = [{"content": t, "special": True, "normalized": False} for t in cls.unused
                 if t not in declared and backend.token_to_id(t) is not None]
        if mask not in declared and backend.token_to_id(mask) is not None:
            extra.append({"content": mask, "special": True, "normalized": False, "lstrip": True})
        return super()._assemble(backend, settings, added + extra, normalizer_spec, source)


class AlbertTokenizer(UnigramTokenizer):
    """ALBERT's tokenizer: a SentencePiece Unigram model behind BERT-style text clean-up (`` and '' to ",
    accents stripped unless `keep_accents`, lower-cased unless `do_lower_case: false`), with BERT's
    `[CLS] A [SEP] B [SEP]` pairs, the second segment typed 1. As transformers' AlbertTokenizer, it sends
    no token_type_ids unless asked (`return_token_type_ids=True`)."""

    kind, transformers_class = "SentencePiece Unigram (ALBERT)", "AlbertTokenizer"
    classes = {"AlbertTokenizer", "AlbertTokenizerFast"}
    default_specials = ALBERT_SPECIALS
    flags = {"do_lower_case": True, "keep_accents": False}
    unk_id = 1
    spm_file = "spiece.model"
    trained_specials = ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"]

    @classmethod
    def _vocab_of(cls, model: SentencePieceModel) -> list[tuple[str, float]]:
        """ALBERT's spiece.model holds its specials itself (<pad>=0 <unk>=1 [CLS] [SEP] [MASK]): every piece, as is."""
        return [(p, s) for p, s, _ in model.pieces]

    @classmethod
    def _normalizers(cls, settings: dict[str, Any]) -> list:
        from tokenizers import normalizers

        steps = [normalizers.Replace("``", '"'), normalizers.Replace("''", '"')]
        if not settings["keep_accents"]:
            steps += [normalizers.NFKD(), normalizers.StripAccents()]
        if settings["do_lower_case"]:
            steps.append(normalizers.Lowercase())
        return steps

    @classmethod
    def _pair_template(cls, bos: str, eos: str) -> tuple[list[str], list[str]]:
        return [bos, "$A", eos], [bos, "$A", eos, "$B:1", f"{eos}:1"]


def _precompiled_charsmap(spec: dict | None) -> bytes | None:
    """The SentencePiece charsmap of a tokenizer.json normaliser, alone or inside a Sequence: the raw bytes
    `normalizers.Precompiled` takes (tokenizer.json stores them base64-encoded)."""
    if not spec:
        return None
    if spec.get("type") == "Precompiled":
        charsmap = spec.get("precompiled_charsmap")
        return base64.b64decode(charsmap) if isinstance(charsmap, str) and charsmap else None
    for inner in spec.get("normalizers") or []:
        found = _precompiled_charsmap(inner)
        if found is not None:
            return found
    return None


class DebertaV2Tokenizer(UnigramTokenizer):
    """DeBERTa-v2/v3's tokenizer: a SentencePiece Unigram model (`spm.model`, every piece as is) behind
    transformers' own clean-up (runs of whitespace, tabs and newlines to one space, NFC, trailing space
    stripped; lower-cased only with `do_lower_case`; punctuation split off with `split_by_punct`), with
    BERT's `[CLS] A [SEP] B [SEP]` pairs, the second segment typed 1, and token_type_ids sent, as
    transformers' DebertaV2Tokenizer does. SentencePiece's own normaliser is not used, as there."""

    kind, transformers_class = "SentencePiece Unigram (DeBERTa)", "DebertaV2Tokenizer"
    classes = {"DebertaV2Tokenizer", "DebertaV2TokenizerFast"}
    model_input_names = ("input_ids", "token_type_ids", "attention_mask")  # type: ignore[assignment]
    default_specials = DEBERTA_SPECIALS
    flags = {"do_lower_case": False, "split_by_punct": False}
    spm_file = "spm.model"
    trained_specials = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]  # DeBERTa-v3's first ids, then [MASK]
    unk_id = 3

    @classmethod
    def _backend_from_spec(cls, model: dict[str, Any], source: Path) -> Backend:
        """tokenizer.json's vocabulary with its own unknown id (transformers finds [UNK]'s where it is)."""
        vocab = model.get("vocab")
        if not isinstance(vocab, list) or not all(isinstance(v, list) and len(v) == 2 for v in vocab):
            raise TokenizerError(f"{source}: a Unigram model needs 'vocab' as [piece, score] pairs")
        unk = model.get("unk_id", cls.unk_id)
        if not isinstance(unk, int) or not 0 <= unk < len(vocab):
            raise TokenizerError(f"{source}: model 'unk_id' {unk!r} is outside the vocabulary")
        return cls._unigram([(str(p), float(s)) for p, s in vocab], unk)

    @classmethod
    def _vocab_of(cls, model: SentencePieceModel) -> list[tuple[str, float]]:
        """DeBERTa's spm.model holds its specials itself ([PAD]=0 [CLS] [SEP] [UNK], then [MASK] in ours): every piece."""
        return [(p, s) for p, s, _ in model.pieces]

    @classmethod
    def _unk_of(cls, model: SentencePieceModel) -> int:
        return model.unk_id  # transformers finds [UNK] where SentencePiece put it

    @classmethod
    def _pipeline(cls, backend: Backend, settings: dict[str, Any], normalizer_spec: dict | None) -> None:
        from tokenizers import Regex, normalizers

        steps = [normalizers.Lowercase()] if settings["do_lower_case"] else []
        steps += [normalizers.Replace(Regex(r"\s{2,}|[\n\r\t]"), " "), normalizers.NFC(),
                  normalizers.Strip(left=False, right=True)]
        backend.normalizer = normalizers.Sequence(steps)
        scheme = "always" if settings["add_prefix_space"] else "first"
        split = [pre_tokenizers.Punctuation(behavior="isolated")] if settings["split_by_punct"] else []
        backend.pre_tokenizer = pre_tokenizers.Sequence(split + [pre_tokenizers.Metaspace(replacement="▁",
                                                                                          prepend_scheme=scheme)])
        backend.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=scheme)
        bos, eos = settings["specials"]["cls_token"], settings["specials"]["sep_token"]
        backend.post_processor = processors.TemplateProcessing(
            single=[bos, "$A", eos], pair=[bos, "$A", eos, "$B:1", f"{eos}:1"],
            special_tokens=[(bos, backend.token_to_id(bos)), (eos, backend.token_to_id(eos))])
