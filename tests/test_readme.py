"""The README's Python examples run as written (the README is the front door: it must not lie)."""

from __future__ import annotations

import pathlib
import re

import pytest

import wal

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_the_readme_has_python_examples() -> None:
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_python_example_runs(index: int) -> None:
    exec(compile(BLOCKS[index], f"README.md python block {index}", "exec"), {"__name__": "__readme__"})


def _layout_rows() -> list[str]:
    section = README.read_text().split("## Layout of the code", 1)[1]
    section = re.split(r"^## ", section, maxsplit=1, flags=re.M)[0]
    return [line for line in section.splitlines() if line.startswith("| ") and "`" in line]


def test_the_layout_table_names_only_paths_that_exist() -> None:
    root = README.parent
    named = {p for row in _layout_rows() for p in re.findall(r"`((?:wal|native)/[^`]*)`", row)}
    assert named
    for path in named:
        assert (root / path).exists(), f"README's layout table names {path}, which is not in the tree"


def test_the_layout_table_names_every_module_and_c_source() -> None:
    """Each module of a wal/ subpackage is named in the row of its folder, each top-level module
    and each C source anywhere in the table: the table is the tree, not a summary of it."""
    root = README.parent
    rows = _layout_rows()
    text = "\n".join(rows)
    for path in sorted((root / "wal").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if path.name == "__init__.py" or "__pycache__" in rel:
            continue
        folder = rel.rsplit("/", 1)[0] + "/"
        if folder == "wal/":
            assert f"`{rel}`" in text, f"README's layout table does not name {rel}"
        else:
            row = [r for r in rows if f"`{folder}`" in r]
            assert row and any(f"`{path.name}`" in r or f"`{rel}`" in r or f"{folder.split('/')[1]}/{path.name}" in r
                               for r in row), f"README's layout table does not name {rel} in the row of {folder}"
    for path in sorted((root / "native").glob("*.c")):
        assert f"`{path.name}`" in text or f"`native/{path.name}`" in text, f"layout table: no {path.name}"


def test_every_relative_link_and_image_of_the_readme_exists() -> None:
    root = README.parent
    text = re.sub(r"```.*?```", "", README.read_text(), flags=re.S)
    targets = {url.split("#", 1)[0] for url in re.findall(r"\]\(([^()\s]+)\)", text)}
    local = {t for t in targets if t and not re.match(r"^[a-z][a-z0-9+.-]*:", t)}
    assert "docs/dataflow.svg" in local
    for target in local:
        assert (root / target).exists(), f"README.md links to {target}, which is not in the tree"


def test_every_error_the_readme_names_is_a_public_name_of_wal() -> None:
    # The failure table named wal.NotFoundError and ReadersFullError, and restore/follow/verify
    # raise ArchiveUnavailableError: none could be caught as wal.<name>.
    readme = README.read_text()
    python = {"CancelledError", "FileNotFoundError", "OSError"}  # asyncio's and the builtins
    named = set(re.findall(r"`(?:wal\.)?([A-Z][A-Za-z]+Error)`", readme)) - python
    assert {"NotFoundError", "ReadersFullError", "ArchiveLagError"} <= named
    for name in named | {"ArchiveError", "ArchiveUnavailableError"}:
        assert issubclass(getattr(wal, name), wal.WalError), name
        assert name in wal.__all__

