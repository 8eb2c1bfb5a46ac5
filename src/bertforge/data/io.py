"""Reading users' files with errors that name the file, line or byte at fault."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from ..errors import InputError


def read_text(path: str | Path) -> str:
    """A whole UTF-8 file (a leading byte-order mark is dropped, as MRPC's files have one)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 at byte {exc.start}") from None


def corrupt(path: str | Path, lines_read: int, exc: BaseException) -> str:
    """The one line for a file that breaks off or is damaged part-way: a truncated or corrupt .gz ends in
    EOFError or zlib.error, which would otherwise surface as a traceback (or, through click, as "interrupted")."""
    what = "corrupt or truncated gzip file" if str(path).endswith(".gz") else "cannot read"
    return (f"{path}: {what} after {lines_read:,} lines ({getattr(exc, 'strerror', None) or exc}); "
            "download or compress it again")


def jsonl_records(path: str | Path, lines: Iterable[tuple[int, str]],
                  text_key: str | None) -> Iterator[tuple[int, dict]]:
    """(line number, object) for the non-blank lines of a JSONL file; each must hold a string `text_key` (or, with
    None, be a JSON object)."""
    for number, line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
        if not isinstance(record, dict):
            raise InputError(f"{path}:{number}: expected a JSON object" + (f" with a string field '{text_key}'"
                                                                            if text_key else " of columns"))
        if text_key is not None and not isinstance(record.get(text_key), str):
            raise InputError(f"{path}:{number}: no string field '{text_key}'")
        yield number, record


def csv_rows(path: str | Path, text: str) -> list[tuple[int, list[str]]]:
    """(the line a record starts on, its fields) for every record of a CSV file's text, blank lines included as
    []. The text is parsed whole, never split into lines first: a quoted field may hold a newline, which stays in
    the field, and the records after it keep their true line numbers. A quote left open is refused by line."""
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    rows = []
    start = 1
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return rows
        except csv.Error as exc:
            raise InputError(f"{path}:{start}: not valid CSV ({exc})") from None
        rows.append((start, row))
        start = reader.line_num + 1

