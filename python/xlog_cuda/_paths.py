"""Where the files a C or C++ build needs are, when this package was
installed from a wheel (`pip install .`): the wheel carries the library,
the headers, the CMake package and the pkg-config file, so that

    cmake -DCMAKE_PREFIX_PATH=$(python -m xlog_cuda --cmake-dir) ...
    cc app.c $(PKG_CONFIG_PATH=$(python -m xlog_cuda --pkgconfig-dir) pkg-config --cflags --libs xlog-cuda)

build against the same libxlog_cuda that `import xlog_cuda` loads.
"""

from __future__ import annotations

import os

from . import _library

__all__ = ["get_prefix", "get_cmake_dir", "get_include_dir", "get_lib_dir", "get_pkgconfig_dir", "NotBundledError"]


class NotBundledError(FileNotFoundError):
    """This xlog_cuda holds no library, headers or CMake files: it is the
    Python package of a source checkout (PYTHONPATH=python), not a wheel."""


def get_prefix() -> str:
    """The install prefix inside the package (lib/, include/)."""
    prefix = _library.bundled_prefix()
    if prefix is None:
        raise NotBundledError(
            f"{os.path.dirname(os.path.abspath(__file__))} has no bundled libxlog_cuda: this is the package of a "
            "source checkout, not an installed wheel. Install it with `python -m pip install .` from the "
            "repository root, or use the build tree (-DXlogCuda_DIR=<build dir>)."
        )
    return prefix


def _existing(path: str) -> str:
    if not os.path.exists(path):
        raise NotBundledError(f"{path} is missing from this installation of xlog_cuda")
    return path


def get_cmake_dir() -> str:
    """The directory holding XlogCudaConfig.cmake: pass it as XlogCuda_DIR,
    or in CMAKE_PREFIX_PATH (find_package searches a prefix entry itself)."""
    return _existing(os.path.join(get_prefix(), "lib", "cmake", "XlogCuda"))


def get_include_dir() -> str:
    """The directory holding xlog_cuda.h and xlog/."""
    return _existing(os.path.join(get_prefix(), "include"))


def get_lib_dir() -> str:
    """The directory holding libxlog_cuda.so, .so.0 and .so.X.Y.Z."""
    return _existing(os.path.join(get_prefix(), "lib"))


def get_pkgconfig_dir() -> str:
    """The directory holding xlog-cuda.pc (for PKG_CONFIG_PATH)."""
    return _existing(os.path.join(get_prefix(), "lib", "pkgconfig"))
