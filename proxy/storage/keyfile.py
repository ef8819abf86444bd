"""The label mirror's keys, saved beside the index snapshot at shutdown, so that the next start
reads only the live labels from the store instead of every live record's key: at a million records
decoding and interning the key columns is most of a start (benchmarks/bench_store.py --records
1000000 --tenants 1000 times both ways).

The file is a cache, never the truth. A label's key never changes, so the start keeps a saved key
for each label the store still holds live, reads the keys of labels written since from the store,
and drops saved labels that died since. A file written for another store or model (its ``stamp``),
of another format or damaged is not used, and the start reads every key from the store as before.

Layout: an 8-byte little-endian length, a JSON header (format, stamp, count, and the distinct
strings of each field), then the labels (int64), one int32 code column per string field and the
answers' sizes (int64). Codes index the field's strings; a user of -1 is none.
"""

from __future__ import annotations

import gc
import itertools
import json
import os
import sys
from collections.abc import Mapping
from operator import attrgetter
from pathlib import Path

import numpy as np

from proxy.storage.base import IndexKey

KEYS_FORMAT = 1
# IndexKey's string fields, in its own order (answer_bytes, last, is a number)
FIELDS = IndexKey._fields[:-1]
_NONE = -1


def keys_path(snapshot: Path) -> Path:
    return Path(f"{snapshot}.keys")


def save_keys(path: Path, keys: Mapping[int, IndexKey], *, stamp: str) -> None:
    """Written beside and renamed into place: a crash mid-save leaves the previous file whole."""
    values = list(keys.values())
    n = len(values)
    names: dict[str, list[str]] = {}
    codes = np.empty((len(FIELDS), n), dtype=np.int32)
    for row, name in enumerate(FIELDS):
        column = list(map(attrgetter(name), values))
        code: dict[str | None, int] = dict.fromkeys(column, 0)
        distinct = [v for v in code if v is not None]
        code.update((v, i) for i, v in enumerate(distinct))
        code[None] = _NONE
        names[name] = distinct
        codes[row] = np.fromiter(map(code.__getitem__, column), dtype=np.int32, count=n)
    header = json.dumps({"format": KEYS_FORMAT, "stamp": stamp, "n": n, "names": names}).encode()
    tmp = Path(f"{path}.tmp")
    with tmp.open("wb") as out:
        out.write(len(header).to_bytes(8, "little"))
        out.write(header)
        out.write(np.fromiter(keys, dtype=np.int64, count=n).tobytes())
        out.write(codes.tobytes())
        out.write(np.fromiter((k.answer_bytes for k in values), dtype=np.int64, count=n).tobytes())
    os.replace(tmp, path)


def load_keys(path: Path, *, stamp: str) -> dict[int, IndexKey] | None:
    """The saved keys; None when there is no file, or it was written for another ``stamp`` or in
    another format. A damaged one raises ValueError (or OSError)."""
    if not path.is_file():
        return None
    raw = path.read_bytes()
    size = int.from_bytes(raw[:8], "little")
    try:
        header = json.loads(raw[8 : 8 + size])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: unreadable header ({exc})") from exc
    if not isinstance(header, dict) or header.get("format") != KEYS_FORMAT or header.get("stamp") != stamp:
        return None
    n, names = int(header["n"]), header["names"]
    body = memoryview(raw)[8 + size :]
    if len(body) != n * (8 + 4 * len(FIELDS) + 8):
        raise ValueError(f"{path}: {len(body)} bytes of keys where its header says {n}")
    labels = np.frombuffer(body[: 8 * n], dtype=np.int64)
    codes = np.frombuffer(body[8 * n : (8 + 4 * len(FIELDS)) * n], dtype=np.int32).reshape(len(FIELDS), n)
    sizes = np.frombuffer(body[(8 + 4 * len(FIELDS)) * n :], dtype=np.int64)
    columns = []
    for row, name in enumerate(FIELDS):
        strings: list[str | None] = [sys.intern(str(v)) for v in names[name]]
        lowest = _NONE if name == "user" else 0
        if n and not (lowest <= int(codes[row].min()) and int(codes[row].max()) < len(strings)):
            raise ValueError(f"{path}: a {name} code outside its {len(strings)} strings")
        strings.append(None)  # code -1, the last item
        columns.append(map(strings.__getitem__, codes[row].tolist()))
    # tuple.__new__ is what IndexKey._make calls, without a Python frame per key
    made = map(tuple.__new__, itertools.repeat(IndexKey), zip(*columns, sizes.tolist(), strict=True))
    collecting = gc.isenabled()
    gc.disable()  # a million new tuples, none in a cycle: the collector would walk them again and again
    try:
        return dict(zip(labels.tolist(), made, strict=True))
    finally:
        if collecting:
            gc.enable()
