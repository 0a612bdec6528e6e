# Stub of the CPython extension built from native/readcall.c.
from typing import Any

def records(buffer: Any, lsns: Any, offsets: Any, lengths: Any, count: int, /) -> list[tuple[int, bytes]]: ...
