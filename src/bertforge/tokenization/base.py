"""What every tokenizer kind shares: transformers' call surface (`__call__` with padding, truncation, offsets,
pairs and tensors; `encode`, `decode`, the vocabulary and the special tokens) over a Hugging Face `tokenizers`
backend. Each kind (`wordpiece.py`, `bpe.py`, `unigram.py`, `verbatim.py`) builds the backend's pipeline from its
files and subclasses `Tokenizer`; nothing here knows which kind it is.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as Backend

from ..errors import TokenizerError
from .files import UNSET_MAX_LENGTH

class Encoding(dict):
    """What `Tokenizer.__call__` returns, as transformers' BatchEncoding is: a dict (input_ids, token_type_ids,
    attention_mask, ...) whose keys are also attributes (`enc.input_ids`), `to(device)` for tensors, and the
    per-row maps `word_ids(i)`, `sequence_ids(i)`, `tokens(i)`, `char_to_token`, `token_to_chars`."""

    def __init__(self, data: dict[str, Any], encodings: list) -> None:
        super().__init__(data)
        self.encodings = encodings

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def to(self, device: Any) -> "Encoding":
        """Every tensor moved to `device` (in place, as transformers' does); returns self."""
        for key, value in self.items():
            if hasattr(value, "to"):
                self[key] = value.to(device)
        return self

    def word_ids(self, index: int = 0) -> list[int | None]:
        return self.encodings[index].word_ids

    def sequence_ids(self, index: int = 0) -> list[int | None]:
        return self.encodings[index].sequence_ids

    def tokens(self, index: int = 0) -> list[str]:
        return self.encodings[index].tokens

    def char_to_token(self, batch_or_char_index: int, char_index: int | None = None,
                      sequence_index: int = 0) -> int | None:
        """The token holding character `char_index` of row `batch_or_char_index` (or of row 0 when one index is
        given), None for a character no token covers (a space)."""
        row, char = (0, batch_or_char_index) if char_index is None else (batch_or_char_index, char_index)
        return self.encodings[row].char_to_token(char, sequence_index)

    def token_to_chars(self, batch_or_token_index: int, token_index: int | None = None) -> tuple[int, int] | None:
        row, token = (0, batch_or_token_index) if token_index is None else (batch_or_token_index, token_index)
        return self.encodings[row].token_to_chars(token)


BatchEncoding = Encoding  # transformers' name
# transformers' decode clean-up (`clean_up_tokenization_spaces`): spaces before these are dropped.
CLEAN_UP = (" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"), \
    (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")
# transformers' order of the special-token attributes (`all_special_tokens` follows it).
SPECIAL_ATTRIBUTES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class Tokenizer:
    """The base of every tokenizer kind: a `tokenizers` backend behind transformers' call signature."""

    # The transformers class this tokenizer is (tokenizer_config.json's `tokenizer_class`), written back on saving.
    tokenizer_class: str = "PreTrainedTokenizerFast"
    # What `__call__` returns by default, as transformers' tokenizer class names it.
    model_input_names: tuple[str, ...] = ("input_ids", "token_type_ids", "attention_mask")

    def __init__(self, backend: Backend, model_max_length: int = 512, specials: dict[str, str] | None = None,
                 extra_specials: list[str] = ()) -> None:
        self.backend = backend
        self.model_max_length = model_max_length
        self.specials = dict(specials or {})
        self.extra_specials = list(extra_specials)
        self.backend.no_truncation()
        self.backend.no_padding()
        # transformers' attributes: which end `__call__` pads and cuts (right, BERT's, unless set)
        self.padding_side = "right"
        self.truncation_side = "right"

    # ----------------------------------------------------------------- saving
    def save_pretrained(self, save_directory: str | Path, legacy_format: bool | None = None,
                        filename_prefix: str | None = None, push_to_hub: bool = False) -> tuple[str, ...]:
        """transformers' name for `save`; returns the files it wrote. `legacy_format` changes nothing (both the
        vocabulary files and tokenizer.json are always written); a filename prefix and pushing to the Hub are
        refused rather than ignored."""
        if filename_prefix or push_to_hub:
            raise TokenizerError("save_pretrained: filename_prefix and push_to_hub are not supported; save to a "
                                 "directory of its own")
        self.save(save_directory)
        return tuple(str(Path(save_directory) / name) for name in self.saved_files)

    # What `save` writes (each kind's own list).
    saved_files: tuple[str, ...] = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")

    def save(self, path: str | Path) -> None:
        """Write this kind's files to the directory `path`."""
        raise NotImplementedError

    def for_words(self) -> "Tokenizer":
        """The tokenizer to encode pre-split words with (`is_split_into_words`): this one, unless a kind needs
        another (byte-level BPE adds a prefix space)."""
        return self

    # ----------------------------------------------------------------- vocabulary
    @property
    def vocab_size(self) -> int:
        """The base vocabulary, without tokens added on top of it (as transformers counts); `len(tok)` counts those
        too, and is the size a model's embeddings need."""
        return self.backend.get_vocab_size(with_added_tokens=False)

    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        return self.backend.get_vocab(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, index: int) -> str | None:
        return self.backend.id_to_token(index)

    def convert_tokens_to_ids(self, tokens: str | list[str]) -> int | list[int]:
        """A token's id (the unknown token's for one not in the vocabulary); a list of them for a list."""
        def one(token: str) -> int:
            found = self.backend.token_to_id(token)
            return found if found is not None else self.unk_token_id

        return one(tokens) if isinstance(tokens, str) else [one(t) for t in tokens]

    def convert_ids_to_tokens(self, ids: int | Iterable[int], skip_special_tokens: bool = False) -> str | list[str]:
        if isinstance(ids, int) or (hasattr(ids, "dim") and ids.dim() == 0):
            return self.backend.id_to_token(int(ids))
        special = self.special_ids if skip_special_tokens else set()
        return [self.backend.id_to_token(int(i)) for i in ids if int(i) not in special]

    # The special tokens, by transformers' attribute names; a role the tokenizer has no token for is None.
    # (RoBERTa-style tokenizers begin and end a text with their CLS and SEP: those are also its bos and eos.)
    def _special(self, role: str) -> str | None:
        if role in ("bos_token", "eos_token") and role not in self.specials:
            return self.specials["cls_token" if role == "bos_token" else "sep_token"] if self.has_sentence_ends else None
        return self.specials.get(role)

    has_sentence_ends = False  # True for the kinds whose tokenizer_config.json names bos/eos (RoBERTa's, XLM-R's)
    pad_token = property(lambda self: self._special("pad_token"))
    unk_token = property(lambda self: self._special("unk_token"))
    cls_token = property(lambda self: self._special("cls_token"))
    sep_token = property(lambda self: self._special("sep_token"))
    mask_token = property(lambda self: self._special("mask_token"))
    bos_token = property(lambda self: self._special("bos_token"))
    eos_token = property(lambda self: self._special("eos_token"))
    pad_token_id = property(lambda self: self._special_id("pad_token"))
    unk_token_id = property(lambda self: self._special_id("unk_token"))
    cls_token_id = property(lambda self: self._special_id("cls_token"))
    sep_token_id = property(lambda self: self._special_id("sep_token"))
    mask_token_id = property(lambda self: self._special_id("mask_token"))
    bos_token_id = property(lambda self: self._special_id("bos_token"))
    eos_token_id = property(lambda self: self._special_id("eos_token"))

    def _special_id(self, role: str) -> int | None:
        token = self._special(role)
        return None if token is None else self.backend.token_to_id(token)

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """Role -> token, for the roles the tokenizer has (transformers' `special_tokens_map`)."""
        found = {r: self._special(r) for r in SPECIAL_ATTRIBUTES if self._special(r) is not None}
        return found | ({"additional_special_tokens": list(self.extra_specials)} if self.extra_specials else {})

    @property
    def all_special_tokens(self) -> list[str]:
        """Every special token once, in transformers' order of roles, then the additional ones."""
        return list(dict.fromkeys([*(self._special(r) for r in SPECIAL_ATTRIBUTES if self._special(r) is not None),
                                   *self.extra_specials]))

    @property
    def all_special_ids(self) -> list[int]:
        return [self.backend.token_to_id(t) for t in self.all_special_tokens]

    @property
    def additional_special_tokens(self) -> list[str]:
        return list(self.extra_specials)

    def add_tokens(self, new_tokens: str | list[str], special_tokens: bool = False) -> int:
        """Add tokens to the vocabulary (kept whole in text, given new ids at the end); returns how many were new.
        Then `model.resize_token_embeddings(len(tok))`, as in transformers."""
        tokens = [new_tokens] if isinstance(new_tokens, str) else list(new_tokens)
        if special_tokens:
            self.extra_specials += [t for t in tokens if t not in self.extra_specials]
            return self.backend.add_special_tokens(tokens)
        return self.backend.add_tokens(tokens)  # (counts a token the vocabulary has as added too, as transformers)

    def add_special_tokens(self, special_tokens_dict: dict[str, Any],
                           replace_additional_special_tokens: bool = True) -> int:
        """transformers' `add_special_tokens({"pad_token": ..., "additional_special_tokens": [...]})`: each token is
        added as a special token (never split, skipped by `decode(skip_special_tokens=True)`) and takes its role;
        returns how many tokens were added, counted as transformers counts them."""
        added = 0
        for role, value in special_tokens_dict.items():
            if role in ("additional_special_tokens", "extra_special_tokens"):
                values = list(value.values()) if isinstance(value, dict) else list(value)
                added += self.backend.add_special_tokens(values)
                kept = [] if replace_additional_special_tokens else self.extra_specials
                self.extra_specials = kept + [t for t in values if t not in kept]
            elif role in SPECIAL_ATTRIBUTES:
                if not isinstance(value, str):
                    raise TypeError(f"add_special_tokens: {role} must be a string, got {type(value).__name__}")
                added += self.backend.add_special_tokens([value])
                self.specials[role] = value
            else:
                raise ValueError(f"add_special_tokens: unknown role {role!r} ({', '.join(SPECIAL_ATTRIBUTES)}, "
                                 "additional_special_tokens)")
        return added

    @property
    def special_ids(self) -> set[int]:
        ids = (self.backend.token_to_id(t) for t in [*self.specials.values(), *self.extra_specials])
        return {i for i in ids if i is not None}

    # ----------------------------------------------------------------- encoding
    def tokenize(self, text: str) -> list[str]:
        """WordPieces of `text`, without special tokens."""
        return self.backend.encode(text, add_special_tokens=False).tokens

    def encode(self, text: str, text_pair: str | None = None, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, text_pair, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: int | Iterable[int], skip_special_tokens: bool = False,
               clean_up_tokenization_spaces: bool | None = None) -> str:
        """Text of `ids` (a list, a tensor or one id). Special tokens are kept unless `skip_special_tokens`, as in
        transformers. `clean_up_tokenization_spaces` (None: the tokenizer's setting) removes the space the decoder
        leaves before punctuation and in English contractions."""
        if isinstance(ids, int) or (hasattr(ids, "dim") and ids.dim() == 0):
            ids = [int(ids)]
        text = self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)
        if clean_up_tokenization_spaces if clean_up_tokenization_spaces is not None else self.clean_up_spaces:
            for before, after in CLEAN_UP:
                text = text.replace(before, after)
        return text

    def batch_decode(self, sequences: Iterable[Iterable[int]], skip_special_tokens: bool = False,
                     clean_up_tokenization_spaces: bool | None = None) -> list[str]:
        """`decode` of each row (a list of lists, or a [B, T] tensor)."""
        return [self.decode(row, skip_special_tokens, clean_up_tokenization_spaces) for row in sequences]

    # WordPiece's decoder cleans those spaces itself whatever the setting (as transformers' fast BertTokenizer does);
    # the other kinds follow tokenizer_config.json's clean_up_tokenization_spaces (`subword.SubwordTokenizer`).
    clean_up_spaces = False

    def __call__(self, text: str | list[str], text_pair: str | list[str] | None = None, *,
                 text_pairs: list[str] | None = None, max_length: int | None = None,
                 truncation: bool | str = False, padding: bool | str = False, stride: int = 0,
                 return_tensors: str | None = None, return_offsets_mapping: bool = False,
                 return_word_ids: bool = False, return_overflowing_tokens: bool = False,
                 return_special_tokens_mask: bool = False, add_special_tokens: bool = True,
                 pad_to_multiple_of: int | None = None, is_split_into_words: bool = False,
                 return_token_type_ids: bool | None = None, truncation_side: str | None = None,
                 return_attention_mask: bool | None = None, return_length: bool = False,
                 padding_side: str | None = None, verbose: bool = True) -> Encoding:
        """Encode one text or a batch, as transformers' tokenizers do.

        truncation: False, True / "longest_first", "only_first" or "only_second".
        padding: False, True / "longest" (to the longest row) or "max_length".
        return_tensors: None (lists), "pt" (torch) or "np" (numpy): ids become [B, T].
        return_overflowing_tokens with `stride`: long inputs become several windows that
        overlap by `stride` tokens; `overflow_to_sample_mapping` says which input each came from.
        is_split_into_words: each text is a list of words (e.g. NER tokens); word ids index them.
        return_token_type_ids: None follows `model_input_names` (RoBERTa's tokenizers send none).
        truncation_side: "right" cuts the end of a long text, "left" its beginning (as TEI's
            `truncation_direction: left` asks); None: the tokenizer's `truncation_side` (right unless set).
        padding_side: None: the tokenizer's `padding_side` (right unless set); "left" pads before the text.
        return_attention_mask: None or True returns it; return_length adds each row's "length" (its tokens,
            padding included, as transformers counts).
        verbose: transformers' switch for its warnings; this tokenizer warns of nothing here, so it changes nothing.
        """
        truncation_side = truncation_side or self.truncation_side
        padding_side = padding_side or self.padding_side
        if padding_side not in ("left", "right"):
            raise ValueError(f"unknown padding_side {padding_side!r} (left or right)")
        pair = text_pair if text_pair is not None else text_pairs
        unit = list if is_split_into_words else str
        single = isinstance(text, str) or (is_split_into_words and text and isinstance(text[0], str))
        texts = [text] if single else list(text)
        pairs = None if pair is None else ([pair] if isinstance(pair, unit) and single else list(pair))
        if pairs is not None and len(pairs) != len(texts):
            raise ValueError(f"got {len(texts)} texts but {len(pairs)} text pairs")
        for t in texts + (pairs or []):
            if not isinstance(t, unit):
                raise TypeError(f"texts must be {'lists of words' if is_split_into_words else 'strings'}, "
                                f"got {type(t).__name__}")

        strategy = {True: "longest_first", "longest_first": "longest_first", "only_first": "only_first",
                    "only_second": "only_second"}.get(truncation)
        if truncation and strategy is None:
            raise ValueError(f"unknown truncation {truncation!r}")
        if truncation_side not in ("left", "right"):
            raise ValueError(f"unknown truncation_side {truncation_side!r} (left or right)")
        if max_length is None and (strategy or padding == "max_length"):
            max_length = self.model_max_length
        if max_length is not None and max_length >= UNSET_MAX_LENGTH:  # no maximum: nothing to cut (transformers)
            if padding == "max_length":
                raise ValueError("padding='max_length' needs max_length: this tokenizer has no model_max_length")
            max_length, strategy = None, None
        if strategy:
            # Each text needs at least one token beside the special ones; with less room, `tokenizers`
            # returns rows longer than max_length (and transformers passes them on), so refuse instead.
            least = (self.backend.num_special_tokens_to_add(pairs is not None) if add_special_tokens else 0) + \
                (2 if pairs is not None else 1)
            if max_length < least:
                raise TokenizerError(f"max_length {max_length} is too short: it must leave each text at least one "
                                     f"token beside the special tokens (at least {least})")
            try:
                self.backend.enable_truncation(max_length, stride=stride, strategy=strategy, direction=truncation_side)
            except ValueError as exc:  # e.g. a stride as long as the window
                raise TokenizerError(str(exc).strip().rstrip(",")) from None
        else:
            self.backend.no_truncation()
        inputs = texts if pairs is None else list(zip(texts, pairs))
        try:
            encodings = self.backend.encode_batch(inputs, is_pretokenized=is_split_into_words,
                                                  add_special_tokens=add_special_tokens)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # the Rust side raises plain Exceptions, or panics (a BaseException),
            # for a truncation it cannot do, e.g. a stride longer than the room one text has beside its pair
            raise TokenizerError(f"cannot encode the input: {str(exc).splitlines()[0]}") from None
        finally:
            self.backend.no_truncation()

        sample_map = list(range(len(encodings)))
        if return_overflowing_tokens:
            flat, sample_map = [], []
            for i, enc in enumerate(encodings):
                for piece in [enc, *enc.overflowing]:
                    flat.append(piece)
                    sample_map.append(i)
            encodings = flat

        if padding:
            target = max(len(e.ids) for e in encodings) if padding in (True, "longest") else max_length
            if pad_to_multiple_of:
                target = -(-target // pad_to_multiple_of) * pad_to_multiple_of
            for enc in encodings:
                if len(enc.ids) < target:
                    enc.pad(target, direction=padding_side, pad_id=self.pad_token_id, pad_type_id=0,
                            pad_token=self.specials["pad_token"])

        data: dict[str, Any] = {
            "input_ids": [e.ids for e in encodings],
            "token_type_ids": [e.type_ids for e in encodings],
            "attention_mask": [e.attention_mask for e in encodings],
        }
        if not (return_token_type_ids if return_token_type_ids is not None
                else "token_type_ids" in self.model_input_names):
            del data["token_type_ids"]
        if return_offsets_mapping:
            data["offset_mapping"] = [e.offsets for e in encodings]
        if return_special_tokens_mask:
            data["special_tokens_mask"] = [e.special_tokens_mask for e in encodings]
        if return_attention_mask is False:
            del data["attention_mask"]
        if return_length:
            data["length"] = [len(e.ids) for e in encodings]
        if return_word_ids:
            data["word_ids"] = [e.word_ids for e in encodings]
        if return_overflowing_tokens:
            data["overflow_to_sample_mapping"] = sample_map

        if return_tensors is not None:
            data = {k: _as_tensor(k, v, return_tensors) for k, v in data.items()}
        elif single and not return_overflowing_tokens:
            data = {k: v[0] for k, v in data.items()}
        return Encoding(data, encodings)


def _as_tensor(key: str, rows: list, kind: str):
    if key == "word_ids":
        return rows  # holds None for special tokens: no tensor form
    lengths = {len(r) for r in rows} if rows and isinstance(rows[0], list) else {0}  # ("length": one int a row)
    if len(lengths) > 1:
        raise ValueError("rows differ in length: pass padding=True to build a tensor")
    import numpy as np

    array = np.asarray(rows, dtype=np.int64)
    if kind == "np":
        return array
    if kind == "pt":
        import torch

        return torch.from_numpy(array)
    raise ValueError(f"return_tensors must be 'pt' or 'np', got {kind!r}")


