"""The `<s> A </s></s> B </s>` tokenizers: RoBERTa's byte-level BPE and XLM-RoBERTa's SentencePiece Unigram.

Both are built the way transformers builds them: the vocabulary (and, for BPE, the merges) from
the directory's files, the rest of the pipeline from tokenizer_config.json's settings
(`settings.py`), and the added tokens, with their lstrip/rstrip flags, from tokenizer.json. The
call signature, padding, truncation, offsets and tensors are the WordPiece tokenizer's
(`tokenizer.py`); only the pipeline differs. Neither sends token_type_ids by default, as in
transformers.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, ClassVar

from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors, trainers
from tokenizers import Tokenizer as Backend

from ..errors import TokenizerError
from ..jsonfile import read_json_object
from ..safefiles import atomic_write, write_text
from .settings import ALBERT_SPECIALS, DEBERTA_SPECIALS, SENTENCE_SPECIALS, read_sentence_settings
from .spm import SentencePieceModel, read_model, train_unigram
from .tokenizer import SPECIAL_ROLES, Tokenizer, _read_lines

log = logging.getLogger("bertforge")

# A new vocabulary's first ids, as fairseq (and so RoBERTa and XLM-R) number them.
TRAINED_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]


class SentenceTokenizer(Tokenizer):
    """What the BPE and Unigram tokenizers share: settings, added tokens, training, saving and decoding."""

    model_input_names = ("input_ids", "attention_mask")  # type: ignore[assignment]  (no segments in this family)
    kind: ClassVar[str]
    classes: ClassVar[set[str]]  # tokenizer_class names in tokenizer_config.json that are this pipeline
    default_prefix_space: ClassVar[bool]
    model_type: ClassVar[str]  # the spec "type" of tokenizer.json's model
    transformers_class: ClassVar[str]  # the tokenizer_class written on saving
    _keeps_normalizer: ClassVar[bool] = False  # whether tokenizer.json's normaliser is part of the model
    needs_prefix_space_for_words: ClassVar[bool] = False  # pre-split words need add_prefix_space (BPE)
    default_specials: ClassVar[dict[str, str]] = SENTENCE_SPECIALS  # the special tokens transformers defaults
    flags: ClassVar[dict[str, bool]] = {}  # the pipeline's own true/false settings in tokenizer_config.json

    def __init__(self, backend: Backend, settings: dict[str, Any]) -> None:
        super().__init__(backend, lowercase=False, strip_accents=None, model_max_length=settings["model_max_length"],
                         chinese_chars=False, specials=settings["specials"])
        self.settings = settings

    # ----------------------------------------------------------------- loading
    @classmethod
    def from_pretrained(cls, path: str | Path) -> "SentenceTokenizer":
        """A directory holding tokenizer.json (or this kind's own vocabulary files), read as transformers reads it."""
        path = Path(path)
        if not path.is_dir():
            raise TokenizerError(f"{path}: no such tokenizer directory")
        settings = read_sentence_settings(path, cls.classes, cls.default_prefix_space, cls.default_specials, cls.flags)
        json_file = path / "tokenizer.json"
        added: list[dict[str, Any]] = []
        if json_file.is_file():
            spec = read_json_object(json_file, TokenizerError)
            model = spec.get("model") or {}
            if model.get("type") != cls.model_type:
                raise TokenizerError(f"{json_file}: model type {model.get('type')!r} is not {cls.model_type}, "
                                     f"which a {cls.kind} tokenizer needs")
            backend = cls._backend_from_spec(model, json_file)
            added = spec.get("added_tokens") or []
            if spec.get("normalizer") and not cls._keeps_normalizer:
                log.warning("%s: its normalizer is dropped, as transformers builds this tokenizer without one", json_file)
            normalizer_spec = spec.get("normalizer")
        else:
            backend, normalizer_spec = cls._backend_from_files(path), None
        return cls._assemble(backend, settings, added, normalizer_spec, path)

    @classmethod
    def _assemble(cls, backend: Backend, settings: dict[str, Any], added: list[dict[str, Any]],
                  normalizer_spec: dict | None, source: Path) -> "SentenceTokenizer":
        specials = settings["specials"]
        missing = [f"{specials[r]!r} ({r})" for r in ("pad_token", "cls_token", "sep_token")
                   if backend.token_to_id(specials[r]) is None]
        if missing:
            raise TokenizerError(f"{source}: vocabulary lacks the special token(s) {', '.join(missing)}")
        cls._pipeline(backend, settings, normalizer_spec)
        # Added tokens as tokenizer.json declares them (flags included); the special tokens in any case.
        declared = {t.get("content") for t in added}
        for token in added:
            if not isinstance(token.get("content"), str):
                raise TokenizerError(f"{source}: an added token has no 'content': {token!r}")
            flags = {k: bool(token.get(k, False)) for k in ("single_word", "lstrip", "rstrip")}
            new = AddedToken(token["content"], normalized=bool(token.get("normalized", not token.get("special"))),
                             special=bool(token.get("special", False)), **flags)
            (backend.add_special_tokens if token.get("special") else backend.add_tokens)([new])
        present = [t for t in dict.fromkeys(specials.values()) if t not in declared and backend.token_to_id(t) is not None]
        backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in present])
        return cls(backend, settings)

    @staticmethod
    def _stream(files: Iterable[str | Path] | None, texts: Iterable[str] | None) -> Iterator[str]:
        """The lines of the files (UTF-8, .gz allowed), then the texts."""
        for file in files or []:
            yield from _read_lines(Path(file))
        if texts is not None:
            yield from texts

    @classmethod
    def _trained(cls, backend: Backend, trainer: Any, files: Iterable[str | Path] | None,
                 texts: Iterable[str] | None) -> "SentenceTokenizer":
        """Train `backend` on the files and texts, then assemble it with transformers' defaults."""
        backend.train_from_iterator(cls._stream(files, texts), trainer)
        # The trainer leaves a model with its own settings (no affixes: None where a loaded one has ""): rebuild it as
        # loading would, so the tokenizer saved and read back is the same, byte for byte (shards check this).
        return cls._new(cls._backend_from_spec(json.loads(backend.to_str())["model"], Path("<trained>")), None)

    @classmethod
    def _new(cls, backend: Backend, normalizer_spec: dict | None) -> "SentenceTokenizer":
        """A newly trained vocabulary, assembled with transformers' default settings for this pipeline."""
        settings = {"specials": {r: cls.default_specials[r] for r in SPECIAL_ROLES}, "model_max_length": 512,
                    "add_prefix_space": cls.default_prefix_space, "trim_offsets": True, "clean_up_spaces": False,
                    **cls.flags}
        return cls._assemble(backend, settings, [], normalizer_spec, Path("<trained>"))

    # ----------------------------------------------------------------- saving
    def save(self, path: str | Path) -> None:
        """Write tokenizer.json and tokenizer_config.json (plus the kind's own vocabulary files)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        atomic_write(path / "tokenizer.json", lambda tmp: self.backend.save(tmp))
        specials = {**{r: self.specials[r] for r in self.specials},
                    "bos_token": self.specials["cls_token"], "eos_token": self.specials["sep_token"]}
        config = {"tokenizer_class": self.transformers_class, "model_max_length": self.model_max_length,
                  "add_prefix_space": self.settings["add_prefix_space"],
                  "clean_up_tokenization_spaces": self.settings["clean_up_spaces"], **specials,
                  **self._config_extra()}
        write_text(path / "tokenizer_config.json", json.dumps(config, indent=2) + "\n")
        write_text(path / "special_tokens_map.json", json.dumps(specials, indent=2) + "\n")
        self._save_vocabulary(path)

    def _config_extra(self) -> dict[str, Any]:
        return {key: self.settings[key] for key in self.flags}

    def _save_vocabulary(self, path: Path) -> None:
        pass

    saved_files = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")

    @property
    def clean_up_spaces(self) -> bool:  # tokenizer_config.json's clean_up_tokenization_spaces
        return self.settings["clean_up_spaces"]

    has_sentence_ends = True  # <s> and </s> are also its bos and eos tokens

    def __call__(self, text: Any, text_pair: Any = None, **kwargs: Any):
        if kwargs.get("is_split_into_words") and self.needs_prefix_space_for_words and \
                not self.settings["add_prefix_space"]:
            # As transformers: each word would otherwise be encoded as if it began the text, not as a word
            # after a space, which is how the model saw every word but the first in pretraining.
            raise TokenizerError(f"a {self.kind} tokenizer encodes pre-split words only with add_prefix_space: "
                                 "true (use tokenizer.for_words())")
        return super().__call__(text, text_pair, **kwargs)

    def for_words(self) -> "SentenceTokenizer":
        """A copy that adds the space before each pre-split word (transformers' add_prefix_space=True, which its
        token-classification examples use for RoBERTa); the same tokenizer when it already does."""
        if self.settings["add_prefix_space"]:
            return self
        settings = {**self.settings, "add_prefix_space": True}
        backend = Backend.from_str(self.backend.to_str())
        self._pipeline(backend, settings, json.loads(self.backend.to_str()).get("normalizer"))
        return type(self)(backend, settings)

    def lowercased(self) -> "Tokenizer":
        raise TokenizerError(f"a {self.kind} tokenizer has no lower-casing setting (sentence-transformers' "
                             "do_lower_case) in bertforge yet")

    # ----------------------------------------------------------------- the kind's own parts
    @classmethod
    def _backend_from_spec(cls, model: dict[str, Any], source: Path) -> Backend:
        raise NotImplementedError

    @classmethod
    def _backend_from_files(cls, path: Path) -> Backend:
        raise NotImplementedError

    @classmethod
    def _pipeline(cls, backend: Backend, settings: dict[str, Any], normalizer_spec: dict | None) -> None:
        raise NotImplementedError


class ByteLevelBPETokenizer(SentenceTokenizer):
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

    saved_files = SentenceTokenizer.saved_files + ("vocab.json", "merges.txt")

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


class UnigramTokenizer(SentenceTokenizer):
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
    def from_pretrained(cls, path: str | Path) -> "SentenceTokenizer":
        """tokenizer.json, or the SentencePiece model file alone (`sentencepiece.bpe.model`, ALBERT's `spiece.model`)."""
        path = Path(path)
        if path.is_dir() and not (path / "tokenizer.json").is_file() and (path / cls.spm_file).is_file():
            model = read_model(path / cls.spm_file)
            settings = read_sentence_settings(path, cls.classes, cls.default_prefix_space, cls.default_specials,
                                              cls.flags)
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
