"""The fuzz targets' checks, run cheaply and deterministically: no atheris, the plain build.

`fuzz/fuzz_segment.py` holds the C segment scanner against the pure-Python reference decoder
field by field; `fuzz/fuzz_open.py` opens logs and stores built from damaged directories and
checks that the outcome is a `wal.WalError` or a gap-free prefix of the valid records in the
input (FORMAT.md sections 8-11, 14-15). `fuzz/run.sh SECONDS` runs them under libFuzzer with
ASan/UBSan; here every seed of `fuzz/corpus/<target>` and a few thousand seeded random inputs
go through the same `test_one_input` functions, so CI exercises the same oracles in seconds.

Findings (`fuzz/findings/README.md`, all fixed) are kept as a regression corpus: each one's
minimal check through the public API (`fuzz/findings/reproduce.py`) must pass, and each saved
fuzz input that once tripped its target must now pass every check. A new finding gets the
same treatment (and, while open, a name in `fuzz/_common.py`'s KNOWN_FINDINGS so fuzz runs
can step over it with AGENTWAL_FUZZ_KNOWN).
"""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
FUZZ = ROOT / "fuzz"

# name -> reproducing inputs in fuzz/findings/ (F<n>-<name>.<target>.bin)
FIXED_FINDINGS = {
    "lsn-wrap": ("F1-lsn-wrap.segment.bin", "F1-lsn-wrap.open.bin"),
    "store-key-size": ("F2-store-key-size.open.bin",),
    "read-buffer-error": ("F3-read-buffer-error.open.bin",),
    "lsn-int64": ("F4-lsn-int64.open.bin",),
    "store-file-json": ("F5-store-file-json.open.bin",),
    "segment-names": ("F6-segment-names.open.bin",),
    "log-id-zero": ("F7-log-id-zero.open.bin",),
    "segment-no-max": ("F8-segment-no-max.open.bin",),
    "readonly-damage": ("F9-readonly-damage.open.bin",),
    "idem-key-size": ("F10-idem-key-size.open.bin",),
}
RANDOM_INPUTS = {"segment": 3000, "open": 1000}


def _load(name: str, directory: Path = FUZZ) -> ModuleType:
    """Import <directory>/<name>.py by path (fuzz/ is not a package; the targets put it on sys.path)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, directory / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def step_over_open_findings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTWAL_FUZZ_KNOWN", ",".join(FIXED_FINDINGS))


@pytest.fixture
def every_check_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTWAL_FUZZ_KNOWN", raising=False)


def _random_inputs(target: str, count: int) -> list[bytes]:
    rng = random.Random(f"agentwal-fuzz-smoke-{target}")
    inputs = []
    for i in range(count):
        if target == "segment":
            mode = i % 4  # raw, checksum fix-up, structure-aware, structure-aware + header CRC
            size = rng.choice((0, 8, 40, 64, 90, 200, 600, 2000))
            inputs.append(bytes([mode | rng.randrange(64) << 2]) + rng.randbytes(size))
        else:
            inputs.append(bytes([i % 256]) + rng.randbytes(rng.choice((16, 60, 150, 400, 1000))))
    return inputs


def test_the_targets_import_without_atheris() -> None:
    for name in ("fuzz_segment", "fuzz_open"):
        module = _load(name)
        assert callable(module.test_one_input)
    assert "atheris" not in sys.modules or sys.modules["atheris"] is not None


def test_every_open_finding_has_a_saved_input_and_a_name_the_targets_know() -> None:
    known = _load("_common").KNOWN_FINDINGS
    assert set(FIXED_FINDINGS) == set(known)
    for files in FIXED_FINDINGS.values():
        for file in files:
            assert (FUZZ / "findings" / file).is_file(), file


@pytest.mark.parametrize("target", ["segment", "open"])
def test_the_seed_corpus_passes_every_check(target: str, every_check_on: None) -> None:
    module = _load(f"fuzz_{target}")
    seeds = sorted((FUZZ / "corpus" / target).iterdir())
    assert len(seeds) >= 20, f"fuzz/corpus/{target} is nearly empty: run fuzz/make_corpus.py"
    for seed in seeds:
        module.test_one_input(seed.read_bytes())


def test_the_seed_corpus_is_small() -> None:
    total = sum(f.stat().st_size for f in (FUZZ / "corpus").rglob("*") if f.is_file())
    assert total < 200_000


@pytest.mark.parametrize("target", ["segment", "open"])
def test_seeded_random_inputs_find_nothing_new(target: str, step_over_open_findings: None) -> None:
    module = _load(f"fuzz_{target}")
    for data in _random_inputs(target, RANDOM_INPUTS[target]):
        module.test_one_input(data)


def test_the_segment_oracle_sees_every_reason_string(every_check_on: None) -> None:
    """The seeds reach every status and every reason of FORMAT.md section 8 (in C and Python alike)."""
    module = _load("fuzz_segment")
    reached = set()
    for seed in (FUZZ / "corpus" / "segment").iterdir():
        reached.add(module.run_one(seed.read_bytes())[1:3])
    reasons = {reason for _, reason in reached}
    assert {status for status, _ in reached} == {"open", "sealed", "torn", "corrupt"}
    assert reasons >= {
        "short header", "bad magic", "unsupported version", "bad header crc", "bad header size",
        "bad header flags", "bad header fields", "truncated header", "zeroed header", "bad length",
        "truncated record", "bad crc", "unknown record type", "bad record flags", "wrong salt",
        "nonzero padding", "lsn gap", "lsn out of order", "bad seal", "bad seal lsn", "data after seal",
        "bad mark", "bad mark lsn",
    }


def test_a_mismatch_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """The segment oracle is live: a C result that differs in one field is a finding."""
    module = _load("fuzz_segment")
    common = _load("_common")
    real = module.c_scan

    def off_by_one(image: bytes) -> object:
        fields, raw = real(image)
        fields["end_offset"] += 1
        return fields, raw

    monkeypatch.setattr(module, "c_scan", off_by_one)
    golden = (ROOT / "tests" / "data" / "golden_two_records.wal").read_bytes()
    with pytest.raises(common.Finding, match="end_offset"):
        module.test_one_input(b"\x00" + golden)


@pytest.mark.parametrize("name", sorted(FIXED_FINDINGS))
def test_fixed_finding_stays_fixed(name: str) -> None:
    """The finding's minimal check through the public API (fuzz/findings/reproduce.py) passes."""
    _load("reproduce", FUZZ / "findings").FINDINGS[name]()


@pytest.mark.parametrize(
    "file", [f for files in FIXED_FINDINGS.values() for f in files], ids=lambda f: f.removesuffix(".bin")
)
def test_saved_finding_input_now_passes_every_check(file: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each input that once tripped its target (a regression corpus) now passes with every check on."""
    target = file.removesuffix(".bin").rsplit(".", 1)[1]
    module = _load(f"fuzz_{target}")
    monkeypatch.delenv("AGENTWAL_FUZZ_KNOWN", raising=False)
    module.test_one_input((FUZZ / "findings" / file).read_bytes())


def test_seeded_random_inputs_open_sealed_values_correctly_or_refuse_them() -> None:
    """fuzz/fuzz_envelope.py: a changed envelope (flipped, cut, grown, under an unknown key id,
    or raw bytes) opens to the sealed value or raises SealDamagedError / MissingKeyError."""
    module = _load("fuzz_envelope")
    rng = random.Random("agentwal-fuzz-smoke-envelope")
    for i in range(3000):
        module.test_one_input(bytes([i % 256]) + rng.randbytes(rng.choice((0, 1, 9, 40, 120, 600))))
