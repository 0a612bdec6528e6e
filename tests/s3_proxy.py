"""S3 proxies for tests, forwarding every request to a real S3 server (SeaweedFS here).

`StrippingProxy` drops the ``If-None-Match`` header, so the server behind it never sees a
create-only PUT: it stands for an object store that does not honour conditional writes.
`HoldingProxy` forwards requests as they are, but holds back the ones `hold(method, path)`
picks until `release` is set: an object store (or a network) slow to answer some PUTs, which
reach it later, all at once. Requests are re-signed (SigV4) with the test credentials.

    with StrippingProxy(server.endpoint) as proxy:   # proxy.endpoint: http://127.0.0.1:PORT
        ...
"""

from __future__ import annotations

import http.client
import http.server
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from archive_server import ACCESS_KEY, SECRET_KEY

_HOP = {"connection", "keep-alive", "transfer-encoding", "host", "content-length", "authorization",
        "x-amz-date", "if-none-match", "expect"}


class StrippingProxy:
    strip = True

    def __init__(self, upstream: str) -> None:
        self.upstream = urlparse(upstream)
        self.stripped = 0  # requests that carried If-None-Match
        self.hold: Callable[[str, str], bool] | None = None  # (method, path): hold it until `release`
        self.release = threading.Event()
        self.held: list[str] = []  # paths of the requests held back
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_args: Any) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = proxy._read_body(self.rfile, length)
                if body is None or (length and proxy._abandoned(self.connection)):
                    self.close_connection = True  # the client gave up first: the request never completes
                    return
                if proxy.hold is not None and proxy.hold(self.command, self.path):
                    with proxy._lock:
                        proxy.held.append(self.path)
                    proxy.release.wait(120)
                keep = set() if proxy.strip else {"if-none-match"}
                if proxy.strip and self.headers.get("If-None-Match") is not None:
                    proxy.stripped += 1
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP or k.lower() in keep}
                signed = proxy._sign(self.command, self.path, headers, body)
                conn = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=30)
                try:
                    conn.request(self.command, self.path, body=body, headers=signed)
                    resp = conn.getresponse()
                    data = resp.read()
                finally:
                    conn.close()
                self.send_response(resp.status, resp.reason)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward  # noqa: N815 -- http.server names

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _read_body(self, stream: Any, length: int) -> bytes | None:
        return stream.read(length) if length else b""

    def _abandoned(self, conn: socket.socket) -> bool:
        """Whether the client closed its side before its request was answered (None here: a
        proxy that reads bodies at once never sees that)."""
        return False

    def _sign(self, method: str, path: str, headers: dict[str, str], body: bytes) -> dict[str, str]:
        from botocore.auth import S3SigV4Auth  # noqa: PLC0415
        from botocore.awsrequest import AWSRequest  # noqa: PLC0415
        from botocore.credentials import Credentials  # noqa: PLC0415

        url = f"{self.upstream.scheme}://{self.upstream.netloc}{path}"
        request = AWSRequest(method=method, url=url, data=body, headers=headers)
        S3SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", "us-east-1").add_auth(request)
        return dict(request.headers.items())

    def __enter__(self) -> StrippingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


class HoldingProxy(StrippingProxy):
    """Forwards requests unchanged (create-only PUTs stay create-only); holds back those that
    `hold` picks until `release` is set (module docstring)."""

    strip = False


class SlowUploadProxy(HoldingProxy):
    """Forwards requests unchanged, taking in each request's body at `rate` bytes per second:
    an object store far away (a slow uplink), where a large PUT takes long to send."""

    def __init__(self, upstream: str, rate: float) -> None:
        super().__init__(upstream)
        self.rate = rate

    def _read_body(self, stream: Any, length: int) -> bytes | None:
        chunks, got, started = [], 0, time.monotonic()
        while got < length:
            chunk = stream.read(min(64 << 10, length - got))
            if not chunk:
                return None
            chunks.append(chunk)
            got += len(chunk)
            time.sleep(max(0.0, started + got / self.rate - time.monotonic()))
        return b"".join(chunks)

    def _abandoned(self, conn: socket.socket) -> bool:
        """The client timed out while its body was still on its way (the kernel's buffers hand
        the proxy all of it even so, after the client closed): as over a real slow link, the
        object store never gets the request whole, and nothing is stored."""
        readable, _, _ = select.select([conn], [], [], 0)
        return bool(readable) and conn.recv(1, socket.MSG_PEEK) == b""
