"""Object-store backends of the archive: ``file:///dir`` and ``s3://bucket/prefix``.

The archive needs these operations and one guarantee from an object store:

- ``put(name, data, create_only=True)``: store an object only if none has that name, else
  `ObjectExistsError`. This is what fences an old writer (FORMAT.md §"Archive", fencing): S3's
  conditional ``If-None-Match: *`` (honored by AWS S3 since 2024, SeaweedFS, MinIO), and
  ``link(2)`` of a fully written and fsynced temporary file for ``file://`` (atomic, refuses an
  existing name, never leaves a half-written object under the final name).
- ``get``, ``get_large`` (the same bytes; a backend may fetch a large object in ranges, in
  parallel: a restore's snapshot is one object, hundreds of MB, where one stream is slower than
  several), ``get_head`` (an object's first bytes, one ranged GET), ``list`` (names in order,
  after a given name: a follower lists only what is new), ``delete`` (merges and retention),
  and ``delete_many`` (a merge's parts: on S3 one DeleteObjects request instead of one request
  each; a default loop of ``delete`` otherwise).

Client library: obstore (the ``agentwal[s3]`` extra), imported only when an ``s3://`` URL or an
obstore store is used. One API over S3, GCS, Azure and local folders, written in Rust: a PUT
costs about a tenth of boto3's CPU (0.2-0.3 ms against 2.7-3.6 ms per request on the benchmark
machine) and runs without the GIL, which matters twice here: the shipper's PUTs share the
process with the commits they make durable, and a restore's verification shares it with its
downloads. It honours create-only PUTs (``mode="create"``, If-None-Match on S3) and reads the
standard AWS environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``, ``AWS_REGION``/``AWS_DEFAULT_REGION``). Any obstore store object
(``S3Store``, ``GCSStore``, ``AzureStore``, ``LocalStore``) can be passed as ``archive=`` itself.
Where obstore is not installed, ``s3://`` goes through boto3 (`S3Objects`), which also reads
``~/.aws`` profiles.

Errors: a missing object raises `ObjectMissingError`; anything transient (connection refused,
timeouts, 5xx, throttling) raises `ArchiveUnavailableError`, which the shipper retries with
backoff. Both are `WalError`s.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import datetime as _dt
import io
import math
import mmap
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from wal._fs import fsync_dir, makedirs_durable
from wal._mounts import NETWORK_FS, mount_of, mounts
from wal.errors import ArgumentError, WalError

if TYPE_CHECKING:
    from wal.crypto.sealing import Sealer

PROBE_PREFIX = "probe/"  # objects of `ObjectStore.check_create_only`, deleted right after
RANGE_BYTES = 16 << 20  # `get_large`: a large object is fetched in ranges of this size,
RANGE_PARALLEL = 8  # this many at a time


class ArchiveError(WalError):
    """An archive operation failed (the message names the object and the URL)."""


class ArchiveUnavailableError(ArchiveError):
    """The object store could not be reached or refused the request for now; retried with backoff."""


class ObjectExistsError(ArchiveError):
    """A create-only write found an object of that name already there."""


class ObjectMissingError(ArchiveError):
    """No object of that name (it may have been merged or removed by retention meanwhile)."""


class ObjectStore:
    """The five operations the archive uses; see the module docstring for their contracts."""

    url: str = ""
    # Whether create-only writes are honoured, once `check_create_only` has asked the store.
    create_only_honored: bool | None = None
    # How long the probe's first PUT took (seconds): a writer's first estimate of its PUTs'
    # latency, before any of its own is answered (wal.archive.shipper, admissions).
    probe_put_s: float | None = None

    def check_create_only(self) -> bool:
        """Does this object store honour create-only writes (what fences an old writer)? Asked
        once per ObjectStore: a probe object ``probe/<random>`` (FORMAT.md §18) is written
        create-only twice, the second write must be refused, then it is deleted. S3-compatible
        stores that ignore ``If-None-Match`` accept the second write. ArchiveError if the store
        does not answer."""
        if self.create_only_honored is None:
            name = f"{PROBE_PREFIX}{uuid.uuid4().hex}"
            started = time.monotonic()
            self.put(name, b"agentwal create-only probe 1", create_only=True)
            self.probe_put_s = time.monotonic() - started
            try:
                self.put(name, b"agentwal create-only probe 2", create_only=True)
                honoured = False
            except ObjectExistsError:
                honoured = True
            finally:
                self.delete(name)
            self.create_only_honored = honoured
        return self.create_only_honored

    def put(self, name: str, data: bytes | memoryview, *, create_only: bool = True) -> None:
        """Store `data` as object `name` (create_only: only where no object has that name,
        else `ObjectExistsError`). `data` may be a view of a mapped file (a spooled snapshot,
        wal/archive/spool.py), read while the call lasts and not copied where the client can
        send a buffer as it is."""
        raise NotImplementedError

    def stream_sealer(self) -> Sealer | None:
        """The sealer that writes this archive's envelopes as a stream (a large object spooled to
        a file, then `put_envelope`), or None: objects go to `put` as they are."""
        return None

    def put_envelope(self, name: str, data: bytes | memoryview, *, create_only: bool = True) -> None:
        """`put` of an object sealed already by `stream_sealer()`'s `Sealer.sealing`."""
        raise NotImplementedError(f"{self.url} does not seal its objects")

    def get(self, name: str) -> bytes:
        raise NotImplementedError

    def get_buffer(self, name: str) -> bytes | memoryview:
        """`get`, as a buffer the caller only reads: where the client hands the body over in a
        buffer of its own, that buffer, not a copy of it in a new bytes object (a restore reads
        every log object once, and its CPU is shared with the downloads). Here: `get`."""
        return self.get(name)

    def get_head(self, name: str, n: int) -> bytes:
        """The first n bytes of an object at least n bytes long (one ranged GET where the store
        has them): what a writer's open reads of its archive's newest snapshot (its envelope's
        key id). Here: `get`, cut."""
        return self.get(name)[:n]

    def read_ranged(self, name: str, *, window: int | None = None) -> RangedRead:
        """Start fetching an object that may be large (a snapshot), for a reader that uses its
        bytes as they arrive (`RangedRead`), holding about `window` bytes of it at a time where
        the backend fetches in ranges. Here: `get`, whole."""
        return RangedRead(self.get(name))

    def get_large(self, name: str) -> bytes | bytearray | memoryview:
        """`get_buffer` of an object that may be large, through `read_ranged`."""
        read = self.read_ranged(name)
        try:
            read.wait(read.size)
            assert isinstance(read.buffer, bytes | bytearray | memoryview), "a windowed read is only made with a window"
            return read.buffer
        finally:
            read.close()

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[tuple[str, int]]:
        """(name, size) of every object whose name starts with prefix and sorts after start_after."""
        raise NotImplementedError

    def delete(self, name: str) -> None:
        raise NotImplementedError

    def delete_many(self, names: Sequence[str]) -> None:
        """Delete every named object (absent ones are no error), in as few requests as the
        store allows (S3: one DeleteObjects per 1,000 names). Here: one `delete` each."""
        for name in names:
            self.delete(name)

    def list_times(self, prefix: str) -> Iterator[tuple[str, float]]:
        """(name, unix time the object was written) under prefix, for retention."""
        raise NotImplementedError

    def remove_stale_temporaries(self, older_than_s: float) -> int:
        """Remove what writes of objects left behind when their process died, if older than
        `older_than_s`; how many. Here: nothing (an object store's PUT leaves nothing half made)."""
        return 0

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url}>"


class RangedRead:
    """An object being fetched into `buffer` (its whole size), in ranges that may arrive in any
    order: `wait(n)` returns once buffer[:n] is in, or raises what fetching it raised
    (ArchiveError). A backend that reads an object whole hands over a complete one.

    A windowed read (``read_ranged(name, window=W)``: a restore's snapshot, which may be larger
    than the memory it may take) holds about W bytes fetched and not yet used, however large the
    object: its buffer is an anonymous mapping of the object's size (address space, not memory);
    a range is fetched once it starts within W bytes of what the reader has released
    (`release(n)`: done with buffer[:n], whose pages go back to the kernel) or once the reader
    waits for it (so an entry larger than W is still read whole)."""

    def __init__(self, buffer: bytes | bytearray | mmap.mmap | memoryview, *, window: int | None = None) -> None:
        self.buffer = buffer
        self.size = len(buffer)
        self._ranges: collections.deque[tuple[int, concurrent.futures.Future[None]]] = collections.deque()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._window = window
        self._gate = threading.Condition()  # guards what follows; fetching threads wait on it
        self._released = 0  # the reader is done with buffer[:_released]
        self._dropped = 0  # pages below this (a page boundary) were given back
        self._needed = 0  # the reader waits for buffer[:_needed]
        self._admitted_end = 0
        self._closed = False
        self.held_max = 0  # a windowed read: the most bytes admitted for fetching and not released

    def start(self, ranges: list[tuple[int, concurrent.futures.Future[None]]],
              pool: concurrent.futures.ThreadPoolExecutor) -> None:
        """The fetches of the ranges, (start, fetch) in offset order: made after this object,
        whose `admit` they call. A read without them is complete already."""
        self._ranges.extend(ranges)
        self._pool = pool

    def admit(self, start: int, end: int) -> None:
        """In a fetching thread, before it fetches buffer[start:end]: wait (a windowed read)
        until the range is within the window or waited for. ArchiveError once closed."""
        with self._gate:
            while (not self._closed and self._window is not None and start >= self._released + self._window
                   and start >= self._needed):
                self._gate.wait()
            if self._closed:
                raise ArchiveError(f"bytes {start}..{end}: the read was stopped")
            self._admitted_end = max(self._admitted_end, end)
            self.held_max = max(self.held_max, self._admitted_end - self._released)

    def wait(self, upto: int) -> None:
        if self._window is not None and upto > self._needed:
            with self._gate:
                self._needed = upto
                self._gate.notify_all()
        while self._ranges and self._ranges[0][0] < upto:
            self._ranges[0][1].result()
            self._ranges.popleft()

    def release(self, upto: int) -> None:
        """The reader is done with buffer[:upto] (never reads it again): a windowed read gives
        its whole pages back to the kernel and lets the fetches go further."""
        if self._window is None or upto <= self._released:
            return
        with self._gate:
            self._released = upto
            self._gate.notify_all()
        drop = upto // mmap.PAGESIZE * mmap.PAGESIZE
        if drop > self._dropped and isinstance(self.buffer, mmap.mmap):
            self.buffer.madvise(mmap.MADV_DONTNEED, self._dropped, drop - self._dropped)
            self._dropped = drop

    def authenticate(self) -> None:
        """Check whatever authenticates the object's bytes beyond what `wait` checked (an
        encrypted object's tag, `wal.archive.sealed.DecryptingRead`); nothing for plain bytes."""

    def close(self) -> None:
        """Stop fetching (ranges not started are dropped; the buffer stays)."""
        with self._gate:
            self._closed = True
            self._gate.notify_all()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def _in_ranges(objects: ObjectStore, name: str, size: int, window: int | None,
               get_range: Callable[[int, int], bytes | memoryview]) -> RangedRead:
    """A `RangedRead` of object `name` of `size` bytes: one `get` if it fits one range, else
    fetched by `get_range(start, end)`, RANGE_BYTES at a time and RANGE_PARALLEL at once; with a
    `window`, into an anonymous mapping, about that many bytes at a time."""
    if size <= RANGE_BYTES:
        return RangedRead(objects.get_buffer(name))
    where = f"{objects.url}/{name}"
    # Private: MADV_DONTNEED frees a private anonymous page (a shared one stays in shmem).
    buffer: bytearray | mmap.mmap = (bytearray(size) if window is None else
                                     mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS))
    read = RangedRead(buffer, window=window)
    view = memoryview(buffer)

    def fetch(start: int) -> None:
        end = min(size, start + RANGE_BYTES)
        read.admit(start, end)
        got = get_range(start, end)
        if len(got) != end - start:
            raise ArchiveUnavailableError(f"reading {where}: bytes {start}..{end} came back {len(got)} long")
        view[start:end] = got

    pool = concurrent.futures.ThreadPoolExecutor(RANGE_PARALLEL, thread_name_prefix="agentwal-get")
    read.start([(start, pool.submit(fetch, start)) for start in range(0, size, RANGE_BYTES)], pool)
    return read


def fencing_refusal(objects: ObjectStore) -> str:
    """Why an archive on an object store without create-only writes is refused, and what to do."""
    return (f"the object store of {objects.url} does not honour create-only writes (a second PUT with "
            "If-None-Match: * of the same name was accepted): agentwal fences an old writer with them, so a "
            "promoted follower could not stop an old primary from overwriting the archive. Refused. Use an object "
            "store that honours them (AWS S3, MinIO, SeaweedFS, Cloudflare R2, a file:// archive), or, if you "
            "guarantee that only one writer ever ships into this archive, open with archive_fencing=False")


class FileObjects(ObjectStore):
    """Objects as files under a directory (``file:///dir``): a local disk or a mounted share.

    Each object is written to a temporary file, fsynced, then linked under its name (create-only:
    ``link`` fails on an existing name) or renamed over it, and the directory fsynced."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.url = "file://" + self.root
        self._made: set[str] = set()  # directories known to exist durably (makedirs_durable fsyncs)
        # The archive's folder as this handle first found (or made) it: (st_dev, st_ino). Made
        # only by the first put (a writer's open), never again; a folder gone later, or another
        # in its place (a share unmounted leaves its empty mount point; an archive deleted and
        # made anew), is refused: objects would be stored there -- and `replicated` commits
        # acknowledged -- that the archive does not hold.
        self._root_id: tuple[int, int] | None = None
        self._local: bool | None = None  # on a local disk (not a network or FUSE filesystem): see read_ranged

    def _path(self, name: str) -> str:
        parts = name.split("/")
        if not name or any(p in ("", ".", "..") for p in parts):
            raise ArgumentError(f"bad object name {name!r}")
        return os.path.join(self.root, *parts)

    def remove_stale_temporaries(self, older_than_s: float) -> int:
        """The `.tmp-*` files a put killed before its link or rename left (never listed, so never
        read, but never removed either): those older than `older_than_s`, so that a put still
        under way in another process (an old writer's) keeps its file."""
        removed = 0
        cutoff = time.time() - older_than_s
        for directory, _, names in os.walk(self.root):
            for name in names:
                if not name.startswith(".tmp-"):
                    continue
                path = os.path.join(directory, name)
                with contextlib.suppress(FileNotFoundError):
                    if os.stat(path).st_mtime < cutoff:
                        os.unlink(path)
                        removed += 1
        return removed

    def _check_root(self, name: str) -> None:
        """Refuse a put into an archive folder that is not the one this handle wrote to (above)."""
        if self._root_id is None:
            return
        try:
            st = os.stat(self.root)
            found: tuple[int, int] | None = (st.st_dev, st.st_ino)
        except FileNotFoundError:
            found = None
        if found != self._root_id:
            what = "is gone" if found is None else "is another folder than the one written to so far"
            raise ArchiveUnavailableError(
                f"writing {self.url}/{name}: the archive's folder {self.root} {what} (a share unmounted, or the "
                "archive deleted or replaced); it is not written into, where it would hold objects the archive "
                "does not: mount it again (or put it back) and shipping goes on, or reopen the store to ship to "
                "this folder")

    def put(self, name: str, data: bytes | memoryview, *, create_only: bool = True) -> None:
        path = self._path(name)
        directory = os.path.dirname(path)
        tmp = ""
        try:
            if directory not in self._made:
                self._check_root(name)
                makedirs_durable(directory)
                self._made.add(directory)
                if self._root_id is None:
                    st = os.stat(self.root)
                    self._root_id = (st.st_dev, st.st_ino)
            tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            view = memoryview(data)
            try:
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                view.release()  # not left to a traceback: the caller may unmap what it views
                os.close(fd)
            try:
                if create_only:
                    try:
                        os.link(tmp, path)
                    except FileExistsError:
                        raise ObjectExistsError(f"{self.url}/{name} already exists") from None
                else:
                    os.replace(tmp, path)
                    tmp = ""
            finally:
                if tmp:
                    os.unlink(tmp)
                    tmp = ""
            fsync_dir(directory)
        except ArchiveError:
            raise
        except OSError as exc:
            if tmp:  # a write or fsync refused (a full disk): the partial file goes, and its space
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            self._made.discard(directory)  # it may have gone: looked at again (the folder never made again)
            raise ArchiveUnavailableError(f"writing {self.url}/{name}: {exc}") from exc

    def get(self, name: str) -> bytes:
        return self._read(name, -1)

    def get_head(self, name: str, n: int) -> bytes:
        return self._read(name, n)

    def read_ranged(self, name: str, *, window: int | None = None) -> RangedRead:
        """A windowed read maps the file read-only: its bytes are the page cache's, read as they
        are used and dropped from the process as they are released, none copied into its memory
        (objects are never rewritten in place: a put renames a new file in, a delete unlinks).
        Not on a network or FUSE filesystem, where a page that cannot be read in (a file another
        host deleted, a lost server) would be a SIGBUS rather than an error: read whole there."""
        if window is None or not self._local_disk():
            return super().read_ranged(name)
        try:
            with open(self._path(name), "rb") as f:
                if os.fstat(f.fileno()).st_size == 0:
                    return RangedRead(b"")
                return RangedRead(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), window=window)
        except FileNotFoundError:
            raise ObjectMissingError(f"{self.url}/{name} does not exist") from None
        except OSError as exc:
            raise ArchiveUnavailableError(f"reading {self.url}/{name}: {exc}") from exc

    def _local_disk(self) -> bool:
        if self._local is None:
            try:
                mount = mount_of(self.root, mounts())
            except OSError:
                mount = None
            self._local = mount is not None and mount.fstype not in NETWORK_FS and not mount.fstype.startswith("fuse")
        return self._local

    def _read(self, name: str, n: int) -> bytes:
        try:
            with open(self._path(name), "rb") as f:
                return f.read(n)
        except FileNotFoundError:
            raise ObjectMissingError(f"{self.url}/{name} does not exist") from None
        except OSError as exc:
            raise ArchiveUnavailableError(f"reading {self.url}/{name}: {exc}") from exc

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[tuple[str, int]]:
        # Names are "<dir>/<file>": list the directory of the prefix.
        head, _, _ = prefix.rpartition("/")
        directory = os.path.join(self.root, *head.split("/")) if head else self.root
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise ArchiveUnavailableError(f"listing {self.url}/{prefix}: {exc}") from exc
        for entry in entries:
            name = f"{head}/{entry.name}" if head else entry.name
            if entry.name.startswith(".tmp-") or not name.startswith(prefix) or not entry.is_file():
                continue
            if start_after is not None and name <= start_after:
                continue
            try:
                size = entry.stat().st_size
            except FileNotFoundError:  # deleted since the directory was read (a merge, retention)
                continue
            yield name, size

    def list_times(self, prefix: str) -> Iterator[tuple[str, float]]:
        for name, _ in self.list(prefix):
            try:
                yield name, os.stat(self._path(name)).st_mtime
            except FileNotFoundError:
                continue

    def delete(self, name: str) -> None:
        try:
            os.unlink(self._path(name))
        except FileNotFoundError:
            return
        except OSError as exc:
            raise ArchiveUnavailableError(f"deleting {self.url}/{name}: {exc}") from exc


_S3_TRANSIENT_CODES = {"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "Throttling",
                       "RequestTimeTooSkewed", "503", "500", "502", "504"}


_clients: dict[tuple[str, ...], Any] = {}
_clients_lock = threading.Lock()
_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
        "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE")


def _s3_client() -> Any:
    """One boto3 client per process and AWS environment: making one loads botocore's service
    model (~1 s the first time), and a client is thread-safe, so every archive shares it."""
    key = tuple(os.environ.get(name, "") for name in _ENV)
    with _clients_lock:
        client = _clients.get(key)
        if client is not None:
            return client
        try:
            import boto3  # noqa: PLC0415 -- optional: only s3:// URLs need it
            from botocore.config import Config  # noqa: PLC0415
        except ImportError as exc:
            raise ArgumentError("s3:// archives need obstore (or boto3): pip install 'agentwal[s3]'") from exc
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        cfg = Config(connect_timeout=5, read_timeout=30, retries={"max_attempts": 2, "mode": "standard"},
                     max_pool_connections=32)
        client = boto3.session.Session().client("s3", region_name=region, config=cfg)
        _clients[key] = client
        return client


class _ViewReader(io.RawIOBase):
    """A seekable binary file over a memoryview, without copying it (boto3 reads a body it is
    given as a file, and seeks it back to send it again)."""

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view = view.cast("B")
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        chunk = self._view[self._pos:self._pos + len(buffer)]
        n = len(chunk)
        memoryview(buffer).cast("B")[:n] = chunk
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        self._view.release()
        super().close()


class S3Objects(ObjectStore):
    """Objects in an S3 bucket under a prefix (``s3://bucket/prefix``), through boto3: the
    backend of ``s3://`` URLs where obstore is not installed.

    Endpoint, credentials and region come from the standard AWS environment; ``AWS_ENDPOINT_URL``
    points it at any S3-compatible server. Timeouts are short (connect 5 s, read 30 s) and
    botocore's own retries few: the shipper does its own backoff and must notice an outage."""

    def __init__(self, bucket: str, prefix: str, *, client: Any = None) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.url = f"s3://{bucket}/{self.prefix}".rstrip("/")
        self.client = client if client is not None else _s3_client()

    def _err(self, exc: BaseException, doing: str, name: str) -> ArchiveError:
        code = ""
        response = getattr(exc, "response", None)
        if isinstance(response, dict):
            code = str(response.get("Error", {}).get("Code", ""))
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("NoSuchKey", "404", "NotFound") or status == 404:
                return ObjectMissingError(f"{self.url}/{name} does not exist")
            if code in ("PreconditionFailed", "412", "ConditionalRequestConflict") or status in (409, 412):
                return ObjectExistsError(f"{self.url}/{name} already exists")
            if code == "NoSuchBucket":
                return ArchiveUnavailableError(f"{doing} {self.url}/{name}: bucket {self.bucket!r} does not exist")
            if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                return ArchiveUnavailableError(f"{doing} {self.url}/{name}: refused ({code}); check credentials")
        return ArchiveUnavailableError(f"{doing} {self.url}/{name}: {code or type(exc).__name__}: {exc}")

    def put(self, name: str, data: bytes | memoryview, *, create_only: bool = True) -> None:
        body = data if isinstance(data, bytes) else _ViewReader(data)  # boto3 takes bytes or a file
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self.prefix + name, "Body": body}
        if create_only:
            kwargs["IfNoneMatch"] = "*"
        try:
            self.client.put_object(**kwargs)
        except Exception as exc:
            raise self._err(exc, "writing", name) from exc
        finally:
            if isinstance(body, _ViewReader):
                body.close()  # its view released, not left to a traceback

    def get(self, name: str) -> bytes:
        try:
            body: bytes = self.client.get_object(Bucket=self.bucket, Key=self.prefix + name)["Body"].read()
        except Exception as exc:
            raise self._err(exc, "reading", name) from exc
        return body

    def read_ranged(self, name: str, *, window: int | None = None) -> RangedRead:
        """As obstore's: ranged GETs of RANGE_BYTES, RANGE_PARALLEL at once, once the object is
        larger than one range; with a `window`, about that many bytes held at a time."""
        try:
            size = int(self.client.head_object(Bucket=self.bucket, Key=self.prefix + name)["ContentLength"])
        except Exception as exc:
            raise self._err(exc, "reading", name) from exc

        return _in_ranges(self, name, size, window, lambda start, end: self._get_range(name, start, end))

    def get_head(self, name: str, n: int) -> bytes:
        return self._get_range(name, 0, n)

    def _get_range(self, name: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of object `name`: one ranged GET."""
        try:
            got: bytes = self.client.get_object(Bucket=self.bucket, Key=self.prefix + name,
                                                Range=f"bytes={start}-{end - 1}")["Body"].read()
        except Exception as exc:
            raise self._err(exc, "reading", name) from exc
        return got

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[tuple[str, int]]:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self.prefix + prefix}
        if start_after is not None:
            kwargs["StartAfter"] = self.prefix + start_after
        while True:
            try:
                page = self.client.list_objects_v2(**kwargs)
            except Exception as exc:
                raise self._err(exc, "listing", prefix) from exc
            for item in page.get("Contents", ()):
                yield item["Key"][len(self.prefix):], int(item["Size"])
            if not page.get("IsTruncated"):
                return
            kwargs["ContinuationToken"] = page["NextContinuationToken"]

    def list_times(self, prefix: str) -> Iterator[tuple[str, float]]:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self.prefix + prefix}
        while True:
            try:
                page = self.client.list_objects_v2(**kwargs)
            except Exception as exc:
                raise self._err(exc, "listing", prefix) from exc
            for item in page.get("Contents", ()):
                yield item["Key"][len(self.prefix):], item["LastModified"].timestamp()
            if not page.get("IsTruncated"):
                return
            kwargs["ContinuationToken"] = page["NextContinuationToken"]

    def delete(self, name: str) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self.prefix + name)
        except Exception as exc:
            err = self._err(exc, "deleting", name)
            if not isinstance(err, ObjectMissingError):
                raise err from exc

    def delete_many(self, names: Sequence[str]) -> None:
        for at in range(0, len(names), 1000):
            batch = list(names[at:at + 1000])
            try:
                answer = self.client.delete_objects(Bucket=self.bucket, Delete={
                    "Objects": [{"Key": self.prefix + name} for name in batch], "Quiet": True})
            except Exception as exc:
                raise self._err(exc, "deleting", batch[0]) from exc
            for error in answer.get("Errors", ()):
                if error.get("Code") != "NoSuchKey":
                    raise ArchiveUnavailableError(f"deleting {self.url}/{error.get('Key')}: {error.get('Code')}: "
                                                  f"{error.get('Message')}")


_OBSTORE_TIMEOUTS = {"connect_timeout": _dt.timedelta(seconds=5), "timeout": _dt.timedelta(seconds=30)}
# The client's timeout is for a whole request, body included: a PUT of a snapshot or a merged
# object larger than this is given that timeout plus its size at _SLOWEST_PUT_RATE (bytes/s),
# through a client made for it. With 30 s for all, a snapshot over ~1 GB never reached an
# object store slower than ~33 MB/s away: each PUT was cut off and tried again, for ever.
_LARGE_PUT_BYTES = 8 << 20
_SLOWEST_PUT_RATE = 1_000_000
# Few retries inside the client, as for boto3: the shipper retries with its own backoff and must
# notice an outage rather than sit in a client's retry loop.
_OBSTORE_RETRY = {"max_retries": 2, "retry_timeout": _dt.timedelta(seconds=10),
                  "backoff": {"init_backoff": _dt.timedelta(milliseconds=50),
                              "max_backoff": _dt.timedelta(seconds=1), "base": 2.0}}


def _obstore() -> Any:
    try:
        import obstore  # noqa: PLC0415 -- optional: only s3:// URLs and obstore stores need it
    except ImportError:
        return None
    return obstore


def _s3_store(bucket: str, prefix: str, timeout: _dt.timedelta | None = None) -> Any:
    """An obstore S3Store for ``s3://bucket/prefix`` from the standard AWS environment; plain
    ``http://`` endpoints (a local S3-compatible server) are allowed when the endpoint says so.
    `timeout`: a request's, when not _OBSTORE_TIMEOUTS' (a large PUT's)."""
    from obstore.store import S3Store  # noqa: PLC0415

    make: Any = S3Store  # its keyword TypedDicts are checked by obstore at run time
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    options: dict[str, Any] = dict(_OBSTORE_TIMEOUTS, allow_http=endpoint.startswith("http://"))
    if timeout is not None:
        options["timeout"] = timeout
    return make(bucket, prefix=prefix.strip("/") or None, region=region, client_options=options,
                retry_config=_OBSTORE_RETRY, **({"endpoint": endpoint} if endpoint else {}))


class ObstoreObjects(ObjectStore):
    """Objects in an obstore store: ``s3://`` URLs (an S3Store from the AWS environment) or any
    obstore store given as ``archive=`` (S3, GCS, Azure, a local folder), names relative to the
    store's prefix."""

    def __init__(self, store: Any, url: str | None = None,
                 remake: Callable[[_dt.timedelta], Any] | None = None) -> None:
        self.store = store
        self._obstore = _obstore()
        self.url = url or _store_url(store)
        # `remake(timeout)`: the same store with another request timeout, for large PUTs (an
        # s3:// URL's; a store object given as archive= keeps the timeouts it was made with).
        self._remake = remake
        self._large_put_stores: dict[int, Any] = {}

    def _store_for_put(self, size: int) -> Any:
        """The store a PUT of `size` bytes goes through: its timeout long enough for the body at
        _SLOWEST_PUT_RATE (one client per timeout, rounded up to a power of two seconds)."""
        if self._remake is None or size <= _LARGE_PUT_BYTES:
            return self.store
        base = _OBSTORE_TIMEOUTS["timeout"].total_seconds()
        seconds = 1 << math.ceil(math.log2(base + size / _SLOWEST_PUT_RATE))
        store = self._large_put_stores.get(seconds)
        if store is None:
            store = self._large_put_stores[seconds] = self._remake(_dt.timedelta(seconds=seconds))
        return store

    def _err(self, exc: BaseException, doing: str, name: str) -> ArchiveError:
        exceptions = self._obstore.exceptions
        if "NoSuchBucket" in str(exc):  # a 404 as a missing object's, told apart by its body only
            return ArchiveUnavailableError(f"{doing} {self.url}/{name}: the bucket does not exist (NoSuchBucket); "
                                           "check the URL, or create the bucket")
        if isinstance(exc, FileNotFoundError | exceptions.NotFoundError):
            return ObjectMissingError(f"{self.url}/{name} does not exist")
        if isinstance(exc, exceptions.AlreadyExistsError | exceptions.PreconditionError):
            return ObjectExistsError(f"{self.url}/{name} already exists")
        if isinstance(exc, exceptions.PermissionDeniedError | exceptions.UnauthenticatedError):
            return ArchiveUnavailableError(f"{doing} {self.url}/{name}: refused ({type(exc).__name__}); "
                                           "check credentials")
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return ArchiveUnavailableError(f"{doing} {self.url}/{name}: {type(exc).__name__}: {first_line}")

    def put(self, name: str, data: bytes | memoryview, *, create_only: bool = True) -> None:
        try:
            self._obstore.put(self._store_for_put(len(data)), name, data,
                              mode="create" if create_only else "overwrite", use_multipart=False)
        except Exception as exc:
            raise self._err(exc, "writing", name) from exc

    def get(self, name: str) -> bytes:
        return bytes(self.get_buffer(name))

    def get_buffer(self, name: str) -> memoryview:
        try:
            return memoryview(self._obstore.get(self.store, name).bytes())
        except Exception as exc:
            raise self._err(exc, "reading", name) from exc

    def get_head(self, name: str, n: int) -> bytes:
        try:
            return bytes(self._obstore.get_range(self.store, name, start=0, end=n))
        except Exception as exc:
            raise self._err(exc, "reading", name) from exc

    def read_ranged(self, name: str, *, window: int | None = None) -> RangedRead:
        """Ranges of RANGE_BYTES fetched RANGE_PARALLEL at a time, once the object is larger
        than one range: one stream from the benchmark's S3 server ran at 160-340 MB/s, the
        ranges at 310-550 MB/s. Archive objects are immutable (create-only names), so the
        ranges are of one object. With a `window`, into an anonymous mapping, about that many
        bytes at a time (`RangedRead`)."""
        try:
            size = int(self._obstore.head(self.store, name)["size"])
        except Exception as exc:
            raise self._err(exc, "reading", name) from exc

        def get_range(start: int, end: int) -> memoryview:
            try:
                return memoryview(self._obstore.get_range(self.store, name, start=start, end=end))
            except Exception as exc:
                raise self._err(exc, "reading", name) from exc

        return _in_ranges(self, name, size, window, get_range)

    def _metas(self, prefix: str, start_after: str | None) -> list[dict[str, Any]]:
        # Sorted here: S3 lists in name order, but not every obstore store does (a local folder).
        try:
            metas = [meta for batch in self._obstore.list(self.store, prefix=prefix, offset=start_after,
                                                          chunk_size=1000)
                     for meta in batch]
        except Exception as exc:
            raise self._err(exc, "listing", prefix) from exc
        metas.sort(key=lambda meta: str(meta["path"]))
        return metas

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[tuple[str, int]]:
        for meta in self._metas(prefix, start_after):
            yield str(meta["path"]), int(meta["size"])

    def list_times(self, prefix: str) -> Iterator[tuple[str, float]]:
        for meta in self._metas(prefix, None):
            yield str(meta["path"]), float(meta["last_modified"].timestamp())

    def delete(self, name: str) -> None:
        try:
            self._obstore.delete(self.store, name)
        except Exception as exc:
            err = self._err(exc, "deleting", name)
            if not isinstance(err, ObjectMissingError):
                raise err from exc

    def delete_many(self, names: Sequence[str]) -> None:
        if not names:
            return
        try:
            self._obstore.delete(self.store, list(names))  # S3: DeleteObjects, 1,000 names a request
        except Exception as exc:
            err = self._err(exc, "deleting", names[0])
            if not isinstance(err, ObjectMissingError):
                raise err from exc
            # One was gone already (stores other than S3 say so): one by one, absent ones ignored.
            for name in names:
                self.delete(name)


def _store_url(store: Any) -> str:
    """A URL naming an obstore store in messages: ``s3://bucket/prefix`` and the like."""
    config = getattr(store, "config", None) or {}
    prefix = str(getattr(store, "prefix", "") or "").strip("/")
    kind = type(store).__name__
    for scheme, key, of in (("s3", "bucket", "S3Store"), ("gs", "bucket", "GCSStore"),
                            ("az", "container_name", "AzureStore")):
        if kind == of and config.get(key):
            return f"{scheme}://{config[key]}/{prefix}".rstrip("/")
    if kind == "LocalStore":
        return "file:///" + prefix  # its prefix is an absolute path
    return f"{kind}:{prefix}" if prefix else kind


def is_obstore_store(archive: object) -> bool:
    """An obstore store object (S3Store, GCSStore, AzureStore, LocalStore, ...), by its module."""
    return type(archive).__module__.split(".")[0] == "obstore"


def same_location(url: str, other: str) -> bool:
    """Whether two archive URLs (`ObjectStore.url`) name one location: equal, or two ``file://``
    folders that resolve to the same directory (through a symlink, ``..``: the same archive)."""
    if url == other:
        return True
    path, other_path = file_path(url), file_path(other)
    return path is not None and other_path is not None and os.path.realpath(path) == os.path.realpath(other_path)


def parse_url(archive: str) -> tuple[str, str, str]:
    """An archive URL's parts: ("file", directory, "") for ``file:///dir`` (``file://localhost/dir``
    too, the path percent-decoded), ("s3", bucket, prefix) for ``s3://bucket/prefix``. Anything
    else raises ArgumentError naming what is wrong. The one reading of an archive URL: what
    opens the archive, what compares two and what checks one before use all go through it."""
    parsed = urlparse(archive)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise ArgumentError(f"file:// archive URLs name a local path (file:///dir), got {archive!r}")
        path = unquote(parsed.path)
        if not path or path == "/":
            raise ArgumentError(f"the archive URL {archive!r} names no directory")
        if "\0" in path:
            raise ArgumentError(f"the archive URL {archive!r} names a path with a NUL byte, which no file name can "
                                "hold: pass the URL without it")
        return "file", path, ""
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ArgumentError(f"the archive URL {archive!r} names no bucket (s3://bucket/prefix)")
        return "s3", parsed.netloc, unquote(parsed.path)
    raise ArgumentError(f"unsupported archive URL {archive!r}: use s3://bucket/prefix or file:///dir")


def file_path(url: str) -> str | None:
    """The directory a ``file://`` archive URL names, or None for any other (or a malformed) URL."""
    try:
        kind, path, _ = parse_url(url)
    except ArgumentError:
        return None
    return path if kind == "file" else None


def open_objects(archive: str | ObjectStore) -> ObjectStore:
    """The backend for an archive URL (``s3://bucket/prefix``, ``file:///dir``) or an ObjectStore as is."""
    if isinstance(archive, ObjectStore):
        return archive
    if is_obstore_store(archive):
        return ObstoreObjects(archive)
    if not isinstance(archive, str):
        raise ArgumentError(f"an archive must be an s3:// or file:// URL, an obstore store or an ObjectStore, "
                            f"not {archive!r}")
    kind, where, prefix = parse_url(archive)
    if kind == "file":
        return FileObjects(where)
    if _obstore() is not None:
        return ObstoreObjects(_s3_store(where, prefix), f"s3://{where}/{prefix.strip('/')}".rstrip("/"),
                              remake=lambda timeout: _s3_store(where, prefix, timeout))
    return S3Objects(where, prefix)
