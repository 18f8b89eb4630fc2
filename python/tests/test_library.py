"""Finding libxlog_cuda.so. Discovery runs once per process, so each case
runs in a fresh interpreter over a copy of the package placed in a scratch
tree, where the "build trees" are what the test puts there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import xlog_cuda as xc
from xlog_cuda import _library

from conftest import PYTHON_DIR

PROBE = textwrap.dedent(
    """
    import json, sys
    import xlog_cuda as xc
    try:
        print(json.dumps({"path": xc.library_path(), "version": xc.version()}))
    except xc.LibraryNotFoundError as e:
        print(json.dumps({"error": str(e), "tried": e.tried, "import_error": isinstance(e, ImportError)}))
    """
)


def _probe(package_root, env_library=None):
    env = {k: v for k, v in os.environ.items() if k not in ("XLOG_CUDA_LIBRARY", "LD_LIBRARY_PATH")}
    env["PYTHONPATH"] = str(package_root)
    if env_library is not None:
        env["XLOG_CUDA_LIBRARY"] = str(env_library)
    # cwd: `python -c` puts it first on sys.path, so it must not hold another xlog_cuda.
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60,
                         cwd=str(package_root))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture
def scratch(tmp_path):
    """tmp/repo/python/xlog_cuda: the package two levels below a fake repo root."""
    repo = tmp_path / "repo"
    shutil.copytree(os.path.join(PYTHON_DIR, "xlog_cuda"), repo / "python" / "xlog_cuda",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return repo


def _place(src, dst):
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _system_has_library():
    import ctypes.util
    return ctypes.util.find_library("xlog_cuda") is not None


def test_library_path_is_the_loaded_file():
    path = xc.library_path()
    assert os.path.isabs(path) and os.path.isfile(path)
    assert os.path.basename(path).startswith("libxlog_cuda.so")
    env = os.environ.get("XLOG_CUDA_LIBRARY")
    if env:
        assert os.path.samefile(path, env)


def test_env_var_wins(scratch):
    real = xc.library_path()
    _place(real, scratch / "target" / "release" / "libxlog_cuda.so")
    chosen = scratch / "elsewhere" / "libxlog_cuda.so.0.1.0"
    _place(real, chosen)
    result = _probe(scratch / "python", env_library=chosen)
    assert result["path"] == str(chosen)
    assert result["version"] == xc.version()


def test_env_var_pointing_nowhere_is_an_error_not_a_fallback(scratch):
    _place(xc.library_path(), scratch / "target" / "release" / "libxlog_cuda.so")
    result = _probe(scratch / "python", env_library="/nonexistent/libxlog_cuda.so")
    assert result["import_error"] is True
    assert "/nonexistent/libxlog_cuda.so" in result["error"]
    assert result["tried"] == [["$XLOG_CUDA_LIBRARY=/nonexistent/libxlog_cuda.so", "no such file"]]


def test_env_var_pointing_at_a_non_library(scratch, tmp_path):
    junk = tmp_path / "libxlog_cuda.so"
    junk.write_text("not an ELF file")
    result = _probe(scratch / "python", env_library=junk)
    assert result["import_error"] is True and str(junk) in result["error"]


def test_build_tree_order(scratch):
    real = xc.library_path()
    debug = scratch / "target" / "debug" / "libxlog_cuda.so"
    release = scratch / "target" / "release" / "libxlog_cuda.so"
    cmake_versioned = scratch / "build" / "libxlog_cuda.so.0"
    cmake = scratch / "build" / "libxlog_cuda.so"

    _place(real, debug)
    assert _probe(scratch / "python")["path"] == str(debug)
    _place(real, release)
    assert _probe(scratch / "python")["path"] == str(release)
    _place(real, cmake_versioned)
    assert _probe(scratch / "python")["path"] == str(cmake_versioned)
    _place(real, cmake)
    assert _probe(scratch / "python")["path"] == str(cmake)


def test_not_found_lists_every_place(scratch):
    if _system_has_library():
        pytest.skip("libxlog_cuda is installed system-wide: the system loader would find it")
    result = _probe(scratch / "python")
    assert result["import_error"] is True
    places = [where for where, _ in result["tried"]]
    assert places[0] == "$XLOG_CUDA_LIBRARY"
    assert str(scratch / "build" / "libxlog_cuda.so") in places
    assert str(scratch / "target" / "release" / "libxlog_cuda.so") in places
    assert str(scratch / "target" / "debug" / "libxlog_cuda.so") in places
    assert "libxlog_cuda.so.0" in places
    assert places.index(str(scratch / "build" / "libxlog_cuda.so")) < places.index(
        str(scratch / "target" / "release" / "libxlog_cuda.so")) < places.index(
        str(scratch / "target" / "debug" / "libxlog_cuda.so")) < places.index("libxlog_cuda.so.0")
    for place in places:
        assert place in result["error"]


def test_every_prototype_is_declared_on_the_loaded_library():
    lib = xc.load_library()
    for name, (restype, argtypes) in _library.PROTOTYPES.items():
        fn = getattr(lib, name)
        assert fn.restype is restype and list(fn.argtypes) == list(argtypes), name


def test_bundled_copy_comes_after_the_env_var_and_before_the_build_trees(scratch):
    """A wheel puts the library inside the package (xlog_cuda/lib); it is
    loaded with no variable set, and ahead of any build tree."""
    real = xc.library_path()
    _place(real, scratch / "target" / "release" / "libxlog_cuda.so")
    bundled = scratch / "python" / "xlog_cuda" / "lib" / "libxlog_cuda.so.0"
    _place(real, bundled)
    assert _probe(scratch / "python")["path"] == str(bundled)
    chosen = scratch / "elsewhere" / "libxlog_cuda.so.0.1.0"
    _place(real, chosen)
    assert _probe(scratch / "python", env_library=chosen)["path"] == str(chosen)


def _main(package_root, *args):
    env = {k: v for k, v in os.environ.items() if k not in ("XLOG_CUDA_LIBRARY", "PYTHONPATH")}
    env["PYTHONPATH"] = str(package_root)
    return subprocess.run([sys.executable, "-m", "xlog_cuda", *args], env=env, capture_output=True, text=True,
                          timeout=60, cwd=str(package_root))


def test_main_prints_the_bundled_dirs(scratch):
    pkg = scratch / "python" / "xlog_cuda"
    _place(xc.library_path(), pkg / "lib" / "libxlog_cuda.so.0")
    for sub in ("lib/cmake/XlogCuda", "lib/pkgconfig", "include"):
        (pkg / sub).mkdir(parents=True, exist_ok=True)
    expected = {"--cmake-dir": pkg / "lib" / "cmake" / "XlogCuda", "--include-dir": pkg / "include",
                "--lib-dir": pkg / "lib", "--pkgconfig-dir": pkg / "lib" / "pkgconfig", "--prefix": pkg,
                "--library": pkg / "lib" / "libxlog_cuda.so.0"}
    for flag, path in expected.items():
        out = _main(scratch / "python", flag)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == str(path), flag


def test_main_help_is_whole(scratch):
    """--help prints the whole description, not its first line cut off
    mid-sentence, and the build lines with the run-time library path."""
    out = _main(scratch / "python", "--help")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    import xlog_cuda.__main__ as main_module

    for paragraph in main_module.__doc__.strip().split("\n\n"):
        words = " ".join(paragraph.split())
        assert words in text, f"--help lacks {words!r}:\n{out.stdout}"
        # Every paragraph ends a sentence (or is a command line).
        assert words.endswith((".", ":", ")")), words
    assert "where the installed library, headers, CMake package and pkg-config file are" in text
    assert "-Wl,-rpath,$(python -m xlog_cuda --lib-dir)" in text
    assert "LD_LIBRARY_PATH" in text


def test_main_in_a_source_checkout_says_why_it_has_no_dirs(scratch):
    out = _main(scratch / "python", "--cmake-dir")
    assert out.returncode == 1 and out.stdout == ""
    assert "source checkout" in out.stderr and "pip install ." in out.stderr
    with pytest.raises(xc._paths.NotBundledError):
        xc.get_cmake_dir()
