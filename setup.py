"""Only here to hook the native builds into `pip install .`; metadata is in pyproject.toml."""

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

UNSUPPORTED = (
    "agentwal runs on Linux only: its C core uses futex(2), eventfd(2) and fdatasync(2), and this is {platform}. "
    "Nothing was compiled. Install it on Linux (x86_64 and aarch64 wheels, or this sdist with a C compiler), "
    "e.g. in a container or VM."
)


class LinuxOnlyBuildExt(build_ext):
    """build_ext that refuses, before any compiler runs, a system the C core does not support:
    a clear sentence instead of a compiler error halfway through. Building an sdist works anywhere.
    (cffi's cffi_modules subclasses whatever build_ext is given here, so its module is covered.)"""

    def run(self) -> None:
        if not sys.platform.startswith("linux"):
            raise SystemExit("error: " + UNSUPPORTED.format(platform=sys.platform))
        super().run()


# The sanitizer builds (fuzz/build_asan.sh) instrument the CPython extensions too, like the
# cffi module (native/build.py reads the same variable).
SAN_FLAGS = os.environ.get("AGENTWAL_CFLAGS", "").split()

# The power-cut simulator's LD_PRELOAD shim (test-only). Built like an extension module so it
# lands in the package as wal/_crashsim*.so, but it is plain C: never imported, no Python.h use.
crashsim = Extension(
    "wal._crashsim",
    sources=["native/crashsim.c"],
    libraries=["dl"],
    extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
    extra_link_args=["-pthread"],
)

# The log's hot append calls without cffi's generic call (see native/appendcall.c for why and when).
appendcall = Extension(
    "wal._appendcall",
    sources=["native/appendcall.c"],
    include_dirs=["native"],
    extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", *SAN_FLAGS],
)

# A span of log records as Python objects in one call, for Log.read, and an archive log object's
# record section in one call (see native/readcall.c).
readcall = Extension(
    "wal._readcall",
    sources=["native/readcall.c", "native/crc32c.c"],
    include_dirs=["native"],
    extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", *SAN_FLAGS],
)

# The store's commit path, overlay, commit lock, apply queue and record codec (see native/storecore.c),
# and the sealed put's AES-GCM sessions (native/sealcore.c: libcrypto is dlopen'ed, not linked).
storecore = Extension(
    "wal._storecore",
    sources=["native/storecore.c", "native/overlay.c", "native/commitlock.c", "native/collapse.c",
             "native/sealcore.c", "native/forkwatch.c"],
    include_dirs=["native"],
    libraries=["dl"],
    extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", *SAN_FLAGS],
)

# The package's one LMDB binding (see native/lmdbcall.c): LMDB itself is resolved at import
# from py-lmdb's extension, so nothing links against it here.
lmdbcall = Extension(
    "wal._lmdbcall",
    sources=["native/lmdbcall.c", "native/crc32c.c", "native/forkwatch.c"],
    include_dirs=["native"],
    libraries=["dl"],
    extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", *SAN_FLAGS],
)

setup(
    cffi_modules=["native/build.py:ffibuilder"],
    ext_modules=[crashsim, appendcall, readcall, storecore, lmdbcall],
    cmdclass={"build_ext": LinuxOnlyBuildExt},
)
