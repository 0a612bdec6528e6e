"""`agentwal export` / `import`: a store's keys and values as JSON lines, and back.

A sealed store (encrypted or compressed, wal/store/sealed.py) is exported as it is stored:
each line carries the value's envelope under ``"sealed"`` instead of ``"value"``, so an
export of an encrypted store is encrypted too (under the store's keys, each value bound to its
key) and exporting needs no key. Importing such lines opens each envelope (with the keys given:
``--key-file``) and commits the value, sealed again by the target store as it seals any value.

A store that compresses with trained dictionaries (kept in its ``dicts/``) exports each one
first, as a line ``{"zstd_dictionary": "<id, 8 hex digits>", "sealed": envelope}`` holding the
dictionary file's bytes as stored (sealed, so encrypted in an encrypted store): an import opens
them before the values compressed with them, and needs nothing but the export and the keys.

Every key's line carries ``"crc32c"``: the CRC-32C of the key's length (4 bytes, little-endian),
the key and the value (or envelope) bytes. An import checks it before anything is written, so
a line changed after the export (a flipped character that still parses) is refused, naming it,
rather than imported as a wrong value. Lines without it (older exports, or written by hand) are
imported unchecked.

An export is framed: a first line ``{"agentwal_export": 1}`` and a last line ``{"end": {"lines":
N, "crc32c": C}}``, N the lines between them and C the CRC-32C of those lines (each one's UTF-8
bytes and a newline). An import of a file that begins with the first line checks the last, so an
export cut short at a line's end (a full disk, a copy interrupted), with lines dropped, moved or
changed, is refused before anything is written, rather than imported as a smaller store. A file
without the first line (or empty) is refused as well, unless the caller says it is unframed (an
older export, or lines written by hand: ``agentwal import --unframed``).
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

from wal._bindings import lib
from wal.crypto.sealing import CODEC_ENCRYPTED, CONTEXT_VALUE
from wal.errors import ArgumentError, CorruptionError, FormatVersionError, RecordTooLargeError
from wal.ops.inspect import scan
from wal.ops.render import parse_bytes, render_bytes
from wal.ops.target import _writer_target, open_writer, sealing_options
from wal.store.sealed import dict_context, dictionary_files, read_meta, sealer_for
from wal.store.store import MAX_KEY_BYTES, MAX_VALUE_BYTES

BLOB_DIR = "blobs"  # wal.agents.store.BLOB_DIR (a floor beside this one, not below it)

# ---- export / import ---------------------------------------------------------------------------------


class Sealed(bytes):
    """An imported value still in its envelope (an export line's "sealed"): opened at import."""


class SealedDictionary(NamedTuple):
    """An export's trained zstd dictionary: its id and its stored file's bytes (an envelope)."""
    dict_id: int
    envelope: bytes


class Imported(NamedTuple):
    """What `parse_import` read: the (key, value) pairs in file order, and the dictionaries."""
    pairs: list[tuple[bytes, bytes]]
    dictionaries: list[SealedDictionary]


def export_lines(path: str, prefix: bytes = b"", on_warning: Callable[[str], None] | None = None) -> Iterator[str]:
    """An export: a first line {"agentwal_export": 1}, one JSON line per key ({"key", "value",
    "version", "crc32c"}; bytes as text or {"base64": ...}), and an end line counting and
    checksumming the lines between (module docstring). A sealed store's lines carry {"sealed":
    envelope} instead of "value", after a line for each dictionary it keeps. Refused, before any
    line is made, for a store that keeps blob files (`_refuse_blobs`). `on_warning` hears what
    `scan` warns of (a log it could not read to its end: the export then lacks the commits past
    that point)."""
    _refuse_blobs(path)
    return _export_lines(path, prefix, on_warning)


def _refuse_blobs(path: str) -> None:
    """An AgentStore keeps values of `blob_threshold` bytes or more as files in the store's
    ``blobs/`` and commits only a reference to each: an export of its keys and values would
    carry the references without the files (and a store that seals names them by a keyed hash
    of its own), and the import would report success with those values missing. So a store
    with blob files is not exported."""
    blob_dir = os.path.join(path, BLOB_DIR)
    files = sum(len(names) for _root, _dirs, names in os.walk(blob_dir))
    if files:
        raise ArgumentError(
            f"the store at {path} keeps {files} blob file(s) in {blob_dir} (values of an AgentStore's blob_threshold "
            "bytes or more, committed as references to them), which an export does not carry: its import would "
            "reference files the new store lacks. Copy the store's directory instead (with the store closed), "
            "or delete unreferenced blobs first (AgentStore.gc_blobs) if none is still referenced")


def _export_lines(path: str, prefix: bytes, on_warning: Callable[[str], None] | None) -> Iterator[str]:
    sealed = is_sealed(path)
    lines = (value_line(key, value, version, sealed=sealed)  # a sealed store's envelopes
             for key, version, value in scan(path, prefix, on_warning=on_warning, opened=False))
    return framed(itertools.chain(dictionary_lines(path), lines))


EXPORT_FORMAT = 1  # the "agentwal_export" of an export's first line (module docstring)


def framed(lines: Iterator[str]) -> Iterator[str]:
    """`lines` between an export's first line and its last (module docstring). The first of
    `lines` is made before the first line is given: a store that `lines` refuses (not a store, one
    with blob files) is refused before any output, as a file left holding a first line alone
    would import as an export cut short."""
    lines = iter(lines)
    first = next(lines, None)
    yield json.dumps({"agentwal_export": EXPORT_FORMAT})
    count, crc = 0, 0
    for line in itertools.chain(() if first is None else (first,), lines):
        crc = _chain_crc(crc, line)
        count += 1
        yield line
    yield json.dumps({"end": {"lines": count, "crc32c": crc}})


def _chain_crc(crc: int, line: str) -> int:
    data = line.encode("utf-8") + b"\n"
    return int(lib.wal_crc32c(crc, data, len(data)))


def is_sealed(path: str) -> bool:
    """Whether the store at `path` is sealed (encrypted or compressed): its values are envelopes."""
    return isinstance((read_meta(path) or {}).get("sealed"), dict)


def dictionary_lines(path: str) -> Iterator[str]:
    """The export lines of the trained dictionaries the store keeps (module docstring)."""
    if not is_sealed(path):
        return
    for did, file in dictionary_files(path):
        with open(file, "rb") as f:
            envelope = f.read()
        yield json.dumps({"zstd_dictionary": f"{did:08x}", "sealed": render_bytes(envelope)}, ensure_ascii=False)


def value_line(key: bytes, value: bytes, version: int, *, sealed: bool) -> str:
    """The export line of a key's value as stored: under "sealed" for a sealed store's envelope."""
    return json.dumps({"key": render_bytes(key), "sealed" if sealed else "value": render_bytes(value),
                       "version": version, "crc32c": line_crc(key, value)}, ensure_ascii=False)


def line_crc(key: bytes, value: bytes) -> int:
    """An export line's "crc32c": of the key's length (u32 LE), the key and the value's bytes."""
    crc = lib.wal_crc32c(0, len(key).to_bytes(4, "little") + key, len(key) + 4)
    return int(lib.wal_crc32c(crc, value, len(value)))


_NOT_FRAMED = ("{source} is not a whole agentwal export: {where} an export's first line ({{\"agentwal_export\": 1}}). "
               "It lost its beginning, or is an export of an agentwal before exports were framed, or lines written "
               "by hand: import those with --unframed (each line is still checked); nothing was imported")


def parse_import(lines: Iterator[str], source: str, *, unframed: bool = False) -> Imported:
    """Parse and check every line before anything is written.

    An export is framed (its first line and its end line): input without the first line is
    refused, since an export that lost its beginning, a slice of one or nothing at all would
    otherwise import as a smaller store. `unframed=True` takes such input (an export of an
    agentwal before the frame, lines written by hand), each line still checked."""
    out: list[tuple[bytes, bytes]] = []
    dictionaries: list[SealedDictionary] = []
    framing: tuple[int, int] | None = None  # a framed export's (lines, crc) so far (module docstring)
    ended = False
    seen_a_line = False
    n = 0
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        first, seen_a_line = not seen_a_line, True
        if ended:
            raise CorruptionError(f"{source} line {n}: a line after the export's end line: the file was changed; "
                                  "nothing was imported", path=source, reason="export damaged")
        try:
            obj = json.loads(line)
        except ValueError as exc:
            if first and not unframed:
                raise CorruptionError(_NOT_FRAMED.format(source=source, where=f"its line {n} is not"), path=source,
                                      reason="export damaged") from None
            if framing is not None:  # an export's line: cut mid-line (a full disk) or changed
                raise CorruptionError(f"{source} line {n}: not JSON ({exc}): the export was cut short there or "
                                      "changed; nothing was imported", path=source,
                                      reason="export incomplete") from None
            raise ArgumentError(f"{source} line {n}: not JSON ({exc})") from None
        if first and not unframed and not (isinstance(obj, dict) and "agentwal_export" in obj):
            raise CorruptionError(_NOT_FRAMED.format(source=source, where=f"its line {n} is not"), path=source,
                                  reason="export damaged")
        if isinstance(obj, dict) and "agentwal_export" in obj:
            framing = _export_header(obj, source, n, first=not out and not dictionaries and framing is None)
            continue
        if isinstance(obj, dict) and "end" in obj and "key" not in obj:
            if framing is None:
                raise CorruptionError(f"{source} line {n}: an export's end line in a file without the export's "
                                      "first line: it lost its beginning; nothing was imported", path=source,
                                      reason="export damaged")
            _check_end(obj["end"], framing, source, n)
            ended = True
            continue
        if framing is not None:
            framing = (framing[0] + 1, _chain_crc(framing[1], line.rstrip("\r\n")))
        if isinstance(obj, dict) and "zstd_dictionary" in obj:
            did = obj["zstd_dictionary"]
            if not isinstance(did, str) or len(did) != 8 or "sealed" not in obj:
                raise ArgumentError(f"{source} line {n}: expected {{\"zstd_dictionary\": \"<8 hex digits>\", "
                                    "\"sealed\": ...}")
            try:
                dict_id = int(did, 16)
            except ValueError:
                raise ArgumentError(f"{source} line {n}: zstd_dictionary {did!r} is not 8 hex digits") from None
            dictionaries.append(SealedDictionary(dict_id, parse_bytes(obj["sealed"], f"{source} line {n}: sealed")))
            continue
        if not isinstance(obj, dict) or "key" not in obj or ("value" in obj) == ("sealed" in obj):
            raise ArgumentError(f"{source} line {n}: expected an object with \"key\" and \"value\" (or \"sealed\")")
        key = parse_bytes(obj["key"], f"{source} line {n}: key")
        value = (parse_bytes(obj["value"], f"{source} line {n}: value") if "value" in obj
                 else Sealed(parse_bytes(obj["sealed"], f"{source} line {n}: sealed")))
        if not key or len(key) > MAX_KEY_BYTES:
            raise ArgumentError(f"{source} line {n}: key must be 1..{MAX_KEY_BYTES} bytes, got {len(key)}")
        if len(value) > MAX_VALUE_BYTES:
            raise ArgumentError(f"{source} line {n}: value of {len(value)} bytes is over the limit")
        crc = obj.get("crc32c")
        if crc is not None and crc != line_crc(key, value):
            raise CorruptionError(f"{source} line {n}: its crc32c ({crc}) does not match its key and value: the line "
                                  "was changed after the export; nothing was imported", path=source,
                                  reason="export line damaged")
        out.append((key, value))
    if not seen_a_line and not unframed:
        raise CorruptionError(_NOT_FRAMED.format(source=source, where="it is empty, not"), path=source,
                              reason="export damaged")
    if framing is not None and not ended:
        raise CorruptionError(f"{source} ends at line {n} without the export's end line: it was cut short (a full "
                              "disk, a copy interrupted) or lines were dropped; nothing was imported",
                              path=source, reason="export incomplete")
    return Imported(out, dictionaries)


def _export_header(obj: dict[str, object], source: str, n: int, *, first: bool) -> tuple[int, int]:
    version = obj["agentwal_export"]
    if not first:
        raise CorruptionError(f"{source} line {n}: an export's first line, not first: the file was changed or two "
                              "exports were joined; nothing was imported", path=source, reason="export damaged")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ArgumentError(f"{source} line {n}: agentwal_export {version!r} is not an export format version")
    if version > EXPORT_FORMAT:
        raise FormatVersionError(f"{source} is an export of format {version}, written by a newer agentwal; this "
                                 f"one reads format {EXPORT_FORMAT}: import it with the newer one")
    return 0, 0


def _check_end(end: object, framing: tuple[int, int], source: str, n: int) -> None:
    lines, crc = framing
    if not isinstance(end, dict) or end.get("lines") != lines or end.get("crc32c") != crc:
        raise CorruptionError(f"{source} line {n}: the export's end line says {end!r}, the lines before it are "
                              f"{{'lines': {lines}, 'crc32c': {crc}}}: lines were dropped, moved or changed "
                              "after the export; nothing was imported", path=source, reason="export damaged")


def import_pairs(path: str, pairs: list[tuple[bytes, bytes]], *, batch: int = 1000,
                 batch_bytes: int = 8 << 20, create: bool = False,
                 dictionaries: Sequence[SealedDictionary] = (), compression: str | None = None) -> dict[str, int]:
    """Commit the pairs as the store's writer, in transactions of up to `batch` keys /
    `batch_bytes`. Sealed values are opened first, with the `dictionaries` an export carried.
    `compression` ("zstd"): the store is opened with it, so the values are stored compressed
    (and a store `create`d is a compressed one)."""
    target = _writer_target(path, create)
    commits = 0
    last = 0
    sealed = [v for _, v in pairs if isinstance(v, Sealed)]
    if sealed:  # opened before anything is created or written
        encrypted = {bool(v[:1]) and bool(v[0] & CODEC_ENCRYPTED) for v in sealed}
        if True in encrypted and len(sealed) < len(pairs):
            encrypted.add(False)  # a "value" line beside encrypted ones: plaintext forged into the export
        if len(encrypted) > 1:
            raise ArgumentError("the export mixes encrypted and unencrypted values, which no store exports "
                                "(an export is of one store, every value of an encrypted one encrypted): "
                                "it was changed, nothing was imported")
        opener = _opener(path, dictionaries, encrypted.pop())
        pairs = [(k, opener(k, v) if isinstance(v, Sealed) else v) for k, v in pairs]
    with open_writer(target, "import", compression=compression) as store:
        # Every value checked against this store's limit before the first commit: a sealed
        # store's is lower by what its envelopes add, and a value past it was refused only at
        # its own batch, after the batches before it were committed.
        sealer = getattr(store, "_sealer", None)
        limit = MAX_VALUE_BYTES - (sealer.envelope_overhead if sealer is not None else 0)
        for key, value in pairs:
            if len(value) > limit:
                raise RecordTooLargeError(f"the value of key {key!r} ({len(value)} bytes) is over the {limit}-byte "
                                          f"value limit of the store at {path}: nothing was imported")
        i = 0
        while i < len(pairs):
            size = 0
            with store.transaction() as tx:
                j = i
                while j < len(pairs) and j - i < batch and (j == i or size + len(pairs[j][1]) < batch_bytes):
                    tx.put(pairs[j][0], pairs[j][1])
                    size += len(pairs[j][0]) + len(pairs[j][1])
                    j += 1
            i = j
            commits += 1
            last = tx.lsn or last
    return {"keys": len(pairs), "commits": commits, "last_lsn": last}


def _opener(path: str, dictionaries: Sequence[SealedDictionary], encrypted: bool) -> Callable[[bytes, bytes], bytes]:
    """Opens an exported envelope with the command's keys (--key-file: the keys the target store
    is opened with too, so a store it creates is encrypted under the first) and the export's
    dictionaries (each checked: its SHA-256, and the id its line gives). An export of a store
    that was not `encrypted` (compressed only) is opened without keys: its envelopes are not
    encrypted, and a sealer with keys refuses those as a downgrade."""
    options = sealing_options()
    if not encrypted:
        options.pop("encryption", None)
    sealer = sealer_for({}, options, f"the import into {path}")
    for d in dictionaries:
        what = f"the exported zstd dictionary {d.dict_id:08x}"
        if sealer.open_dictionary(d.envelope, dict_context(d.dict_id), what.__str__) != d.dict_id:
            raise ArgumentError(f"{what} holds another dictionary than its line names")

    def open_(key: bytes, envelope: bytes) -> bytes:
        return sealer.open(envelope, CONTEXT_VALUE + key, lambda: f"the exported value of key {key!r}")
    return open_
