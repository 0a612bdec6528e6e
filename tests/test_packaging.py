"""How agentwal installs and what it says when it cannot run: the version's one source, the
dependency pins against the code that relies on them, and the messages of an import from a source
tree, of an unsupported system, and of an install missing a module.

The artifacts themselves (sdist, wheel, auditwheel, every py-lmdb release in the pin, the lowest
cffi) are built and installed by .ci/packaging, which needs the network and minutes; these run
in the suite.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import wal
from wal.store import state

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(wal.__file__).resolve().parent


def _requirement(name: str) -> str:
    """The specifier of `name` in the installed agentwal's requirements, e.g. '>=1.4.1,<3.1'."""
    for text in importlib.metadata.requires("agentwal") or []:
        head = text.split(";")[0].strip()
        if head.startswith(name) and head[len(name):len(name) + 1] in "<>=!~":
            return ",".join(sorted(head[len(name):].replace(" ", "").split(","), key=lambda part: part[0] != ">"))
    raise AssertionError(f"agentwal does not require {name}")


def test_the_version_has_one_source_that_metadata_and_the_command_line_report() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert importlib.metadata.version("agentwal") == wal.__version__
    out = subprocess.run([sys.executable, "-m", "wal", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"agentwal {wal.__version__}"


def test_the_lmdb_pin_is_the_range_the_binding_names() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert f"lmdb{state.LMDB_PACKAGE_RANGE}" in project["dependencies"]
    assert _requirement("lmdb") == state.LMDB_PACKAGE_RANGE


def test_a_missing_lmdb_package_is_named_at_import_with_the_supported_releases(tmp_path: Path) -> None:
    code = "import sys; sys.modules['lmdb'] = None; import wal"  # lmdb present on disk, refused to import
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=False)
    assert out.returncode != 0
    assert "agentwal needs the `lmdb` package (py-lmdb " + state.LMDB_PACKAGE_RANGE + ")" in out.stderr


def _source_tree(tmp_path: Path, *, with_native: bool = True, built: tuple[str, ...] = ()) -> Path:
    """A copy of the package's Python files (and, `with_native`, of native/build.py and
    pyproject.toml: a source tree), with the named C modules copied from the running install."""
    root = tmp_path / "agentwal-src"
    shutil.copytree(PACKAGE, root / "wal", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    if with_native:
        (root / "native").mkdir()
        shutil.copy(ROOT / "native" / "build.py", root / "native" / "build.py")
        shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    for name in built:
        for so in PACKAGE.glob(f"{name}.*so"):
            shutil.copy(so, root / "wal" / so.name)
    return root


def _import_wal(cwd: Path, code: str = "import wal", pythonpath: str | None = None) -> subprocess.CompletedProcess[str]:
    """`import wal` as a user would from `cwd`, without site-packages (-S): the current directory
    first on sys.path, then PYTHONPATH, then the standard library."""
    env = {"PATH": "/usr/bin:/bin"}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=cwd, env=env,
                          check=False)


def test_importing_wal_from_a_source_tree_names_the_tree_and_the_install_to_use_instead(tmp_path: Path) -> None:
    tree = _source_tree(tmp_path)
    out = _import_wal(tree, pythonpath=str(PACKAGE.parent))  # an install with its C core, later on sys.path
    assert out.returncode != 0
    message = out.stderr.strip().splitlines()[-1]
    assert f"`import wal` found agentwal's source tree ({tree / 'wal'}), where the C core is not built" in message
    assert f"agentwal is installed at {PACKAGE}: leave the source tree (cd to another directory)" in message
    assert "pip install -e ." in message  # how to work on the tree itself
    assert "rather than running from a source tree" not in message  # the old advice, wrong for this case


def test_importing_wal_from_a_source_tree_with_nothing_installed_says_to_install_then_leave(tmp_path: Path) -> None:
    tree = _source_tree(tmp_path)
    message = _import_wal(tree).stderr.strip().splitlines()[-1]
    assert "found agentwal's source tree" in message
    assert "Install it (`pip install agentwal`, or `pip install .` here" in message
    assert "then leave the source tree (cd to another directory)" in message


def test_an_install_missing_one_c_module_names_it_and_says_to_reinstall(tmp_path: Path) -> None:
    root = _source_tree(tmp_path, with_native=False, built=("_native", "_appendcall", "_readcall", "_lmdbcall"))
    message = _import_wal(tmp_path, pythonpath=str(root)).stderr.strip().splitlines()[-1]
    assert f"agentwal's C core failed to load from {root / 'wal'} (missing: wal._storecore)" in message
    assert "pip install --force-reinstall agentwal" in message


def test_importing_wal_on_another_system_says_linux_only(tmp_path: Path) -> None:
    tree = _source_tree(tmp_path)
    out = _import_wal(tree, "import sys; sys.platform = 'darwin'; import wal")
    message = out.stderr.strip().splitlines()[-1]
    assert "agentwal runs on Linux only" in message and "this is darwin" in message


def test_building_on_another_system_refuses_before_any_compiler_runs(tmp_path: Path) -> None:
    tree = tmp_path / "sdist"
    tree.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, tree / name)
    shutil.copytree(ROOT / "native", tree / "native")
    shutil.copytree(PACKAGE, tree / "wal", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    # sysconfig is read before the platform is changed: only setup.py's own check sees "darwin".
    code = ("import runpy, sys, sysconfig, setuptools.command.build_ext; sysconfig.get_config_vars(); "
            "sys.platform = 'darwin'; sys.argv = ['setup.py', 'build_ext']; "
            "runpy.run_path('setup.py', run_name='__main__')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tree, check=False)
    assert out.returncode != 0
    assert "error: agentwal runs on Linux only" in out.stderr and "this is darwin. Nothing was compiled." in out.stderr
    assert not list(tree.rglob("*.o")) and not list(tree.rglob("*.so"))


@pytest.mark.parametrize("name", ["LICENSE", "MANIFEST.in"])
def test_the_files_both_artifacts_need_exist(name: str) -> None:
    text = (ROOT / name).read_text()
    assert text.strip()
    if name == "LICENSE":
        assert "Apache License" in text and "Version 2.0, January 2004" in text
    else:
        assert "include native/build.py" in text and "recursive-include native *.c *.h" in text
