"""The zstd codec of sealed values, over whichever zstd binding is installed.

Two bindings give the same frames (RFC 8878, from the same libzstd), so a value compressed by
one opens with the other: the `zstandard` package (the ``crypto`` extra; preferred: its
decompression context is kept per thread), and the standard library's `compression.zstd`
(Python 3.14 and later; `backports.zstd` gives the same module to older Pythons). A store needs
nothing but one of them to be opened with ``compression="zstd"`` or to read a compressed value.

What the sealing asks of a binding is small and fixed here: a compressor that makes one whole
frame per call, declaring its content size (the reader refuses frames that do not: no zstd
bomb) and, where nothing else authenticates the value, a checksum; a frame's declared size and
dictionary id, read before anything is decompressed; a decompressor per dictionary; a
dictionary's id; dictionary training.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any, Protocol

from wal.errors import ArgumentError


class FrameError(Exception):
    """Bytes that are not a zstd frame, or a frame that does not decode."""


class Compressor(Protocol):
    def compress(self, data: bytes | memoryview) -> bytes: ...


class Decompressor(Protocol):
    def decompress(self, frame: bytes, size: int) -> bytes:
        """The contents of `frame`: exactly one zstd frame of `size` bytes (its declared size),
        nothing after it; FrameError otherwise. Never decodes more than `size` + 1 bytes, so
        a second frame (which may declare no size) cannot make it allocate more."""
        ...


class Binding(Protocol):
    name: str

    def compressor(self, level: int, dictionary: bytes | None, checksum: bool) -> Compressor: ...

    def decompressor(self, dictionary: bytes | None) -> Decompressor: ...

    def frame(self, frame: bytes) -> tuple[int | None, int]:
        """(declared content size or None, dictionary id or 0); FrameError if not a frame."""
        ...

    def dict_id(self, dictionary: bytes) -> int: ...

    def check_dictionary(self, dictionary: bytes) -> None:
        """FrameError unless `dictionary` loads for compressing and decompressing."""
        ...

    def train(self, samples: Sequence[bytes], size: int) -> bytes: ...


class _Zstandard:
    name = "zstandard"

    def __init__(self, module: Any) -> None:
        self._z = module

    def compressor(self, level: int, dictionary: bytes | None, checksum: bool) -> Compressor:
        d = self._z.ZstdCompressionDict(dictionary) if dictionary is not None else None
        c: Compressor = self._z.ZstdCompressor(level=level, dict_data=d, write_content_size=True,
                                               write_checksum=checksum)
        return c

    def decompressor(self, dictionary: bytes | None) -> Decompressor:
        d = self._z.ZstdCompressionDict(dictionary) if dictionary is not None else None
        return _ZstandardDecompressor(self._z.ZstdDecompressor(dict_data=d), self._z.ZstdError)

    def frame(self, frame: bytes) -> tuple[int | None, int]:
        try:
            params = self._z.get_frame_parameters(frame)
        except self._z.ZstdError as exc:
            raise FrameError(str(exc)) from None
        size = None if params.content_size == self._z.CONTENTSIZE_UNKNOWN else int(params.content_size)
        return size, int(params.dict_id)

    def dict_id(self, dictionary: bytes) -> int:
        return int(self._z.ZstdCompressionDict(dictionary).dict_id())

    def check_dictionary(self, dictionary: bytes) -> None:
        try:
            _probe(self, dictionary)
        except self._z.ZstdError as exc:
            raise FrameError(str(exc)) from None

    def train(self, samples: Sequence[bytes], size: int) -> bytes:
        return bytes(self._z.train_dictionary(size, list(samples)).as_bytes())


def _probe(binding: Binding, dictionary: bytes) -> None:
    """Load `dictionary` both ways, as a compression will (a damaged one fails here, at its open,
    rather than inside the first seal or read)."""
    probe = b"agentwal dictionary probe"
    frame = binding.compressor(1, dictionary, True).compress(probe)
    if binding.decompressor(dictionary).decompress(frame, len(probe)) != probe:
        raise FrameError("the dictionary does not give back what it compressed")


class _ZstandardDecompressor:
    __slots__ = ("_d", "_error")

    def __init__(self, d: Any, error: type[Exception]) -> None:
        self._d = d
        self._error = error

    def decompress(self, frame: bytes, size: int) -> bytes:
        try:
            # The first frame only (read_across_frames is off), bounded by its declared size,
            # and any byte after it refused (it was ignored).
            out: bytes = self._d.decompress(frame, max_output_size=size, allow_extra_data=False)
        except self._error as exc:
            raise FrameError(str(exc)) from None
        if len(out) != size:
            raise FrameError(f"{len(out)} bytes, not the {size} the frame declares")
        return out


class _Stdlib:
    """`compression.zstd` (or `backports.zstd`). Its decompressor objects serve one frame each, so
    a decompression is the module's one-shot call with the dictionary kept parsed."""

    def __init__(self, module: Any, name: str) -> None:
        self._z = module
        self.name = name

    def compressor(self, level: int, dictionary: bytes | None, checksum: bool) -> Compressor:
        p = self._z.CompressionParameter
        options = {p.compression_level: level, p.content_size_flag: 1, p.checksum_flag: int(checksum)}
        zdict = self._z.ZstdDict(dictionary) if dictionary is not None else None
        return _StdlibCompressor(self._z.ZstdCompressor(options=options, zstd_dict=zdict),
                                 self._z.ZstdCompressor.FLUSH_FRAME)

    def decompressor(self, dictionary: bytes | None) -> Decompressor:
        zdict = self._z.ZstdDict(dictionary) if dictionary is not None else None
        return _StdlibDecompressor(self._z, zdict)

    def frame(self, frame: bytes) -> tuple[int | None, int]:
        try:
            info = self._z.get_frame_info(frame)
        except self._z.ZstdError as exc:
            raise FrameError(str(exc)) from None
        return info.decompressed_size, int(info.dictionary_id)

    def dict_id(self, dictionary: bytes) -> int:
        return int(self._z.ZstdDict(dictionary).dict_id)

    def check_dictionary(self, dictionary: bytes) -> None:
        try:
            _probe(self, dictionary)
        except self._z.ZstdError as exc:
            raise FrameError(str(exc)) from None

    def train(self, samples: Sequence[bytes], size: int) -> bytes:
        return bytes(self._z.train_dict(list(samples), size).dict_content)


class _StdlibCompressor:
    __slots__ = ("_c", "_mode")

    def __init__(self, c: Any, mode: int) -> None:
        self._c = c
        self._mode = mode

    def compress(self, data: bytes | memoryview) -> bytes:
        out: bytes = self._c.compress(data, mode=self._mode)  # one whole frame; the context is reused
        return out


class _StdlibDecompressor:
    __slots__ = ("_dict", "_z")

    def __init__(self, module: Any, zdict: Any) -> None:
        self._z = module
        self._dict = zdict

    def decompress(self, frame: bytes, size: int) -> bytes:
        # A decompressor object decodes one frame (the module's one-shot call decodes every
        # frame it is given, a second one's of any size), and says what is left after it.
        d = self._z.ZstdDecompressor(zstd_dict=self._dict)
        try:
            out: bytes = d.decompress(frame, max_length=size + 1)
        except self._z.ZstdError as exc:
            raise FrameError(str(exc)) from None
        if not d.eof or d.unused_data:
            raise FrameError("bytes after the frame" if d.unused_data else "a frame that does not end")
        if len(out) != size:
            raise FrameError(f"{len(out)} bytes, not the {size} the frame declares")
        return out


def load(name: str) -> Binding:
    """The binding `name` ("zstandard", "compression.zstd" or "backports.zstd"); ImportError if it
    is not installed."""
    if name == "zstandard":
        import zstandard  # noqa: PLC0415 -- an optional dependency

        return _Zstandard(zstandard)
    if name == "compression.zstd":
        import compression.zstd  # type: ignore[import-not-found]  # noqa: PLC0415 -- Python 3.14+

        return _Stdlib(compression.zstd, name)
    if name == "backports.zstd":
        from backports import zstd  # type: ignore[import-not-found, attr-defined, unused-ignore]  # noqa: PLC0415

        return _Stdlib(zstd, name)
    raise ArgumentError(f"unknown zstd binding {name!r}")


PREFERENCE = ("zstandard", "compression.zstd", "backports.zstd")


@functools.cache
def binding() -> Binding:
    """The first installed binding of `PREFERENCE` (``AGENTWAL_ZSTD=NAME`` picks one), loaded once;
    ArgumentError saying what to install when there is none."""
    wanted = os.environ.get("AGENTWAL_ZSTD")
    for name in (wanted,) if wanted else PREFERENCE:
        try:
            return load(name)
        except ImportError:
            continue
    raise ArgumentError("compression='zstd' needs a zstd binding: pip install 'agentwal[crypto]' (the zstandard "
                        "package), or Python 3.14+ (compression.zstd), or backports.zstd"
                        + (f"; AGENTWAL_ZSTD={wanted} is not installed" if wanted else ""))
