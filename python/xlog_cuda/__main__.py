"""python -m xlog_cuda: where the installed library, headers, CMake package
and pkg-config file are, for builds against the copy this package loads.

Builds against it:

    cmake -DCMAKE_PREFIX_PATH=$(python -m xlog_cuda --cmake-dir) -S app -B build
    cc app.c -I$(python -m xlog_cuda --include-dir) -L$(python -m xlog_cuda --lib-dir) -lxlog_cuda \\
       -Wl,-rpath,$(python -m xlog_cuda --lib-dir)

The -Wl,-rpath part lets the program find libxlog_cuda.so.0 when it runs
(or set LD_LIBRARY_PATH to the --lib-dir directory instead). Without an
option it prints a summary. Exit status 1 (with the reason on stderr) when
this package has no bundled files (a source checkout).

Other commands: python -m xlog_cuda.report LOG (an HTML memory report of a
log); python -m xlog_cuda.replay LOG (replay an xlog or RMM log on sim:
xlog's held peak against the log's live peak).
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from . import _paths


def main(argv: Optional[List[str]] = None) -> int:
    # The docstring is the help: its first paragraph the description, the
    # rest (the build lines) the epilog, both printed as written. (Under
    # python -OO there is no docstring: then the usage alone.)
    summary, _, details = (__doc__ or "").strip().partition("\n\n")
    ap = argparse.ArgumentParser(prog="python -m xlog_cuda", description=summary, epilog=details,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--cmake-dir", action="store_true", help="the directory of XlogCudaConfig.cmake")
    which.add_argument("--include-dir", action="store_true", help="the directory of xlog_cuda.h")
    which.add_argument("--lib-dir", action="store_true", help="the directory of libxlog_cuda.so*")
    which.add_argument("--pkgconfig-dir", action="store_true", help="the directory of xlog-cuda.pc")
    which.add_argument("--prefix", action="store_true", help="the install prefix inside the package")
    which.add_argument("--library", action="store_true", help="the libxlog_cuda file `import xlog_cuda` loads")
    which.add_argument("--version", action="store_true", help="the package's and the library's versions")
    args = ap.parse_args(argv)

    try:
        if args.cmake_dir:
            print(_paths.get_cmake_dir())
        elif args.include_dir:
            print(_paths.get_include_dir())
        elif args.lib_dir:
            print(_paths.get_lib_dir())
        elif args.pkgconfig_dir:
            print(_paths.get_pkgconfig_dir())
        elif args.prefix:
            print(_paths.get_prefix())
        elif args.library or args.version:
            import xlog_cuda

            print(xlog_cuda.library_path() if args.library else f"xlog_cuda {xlog_cuda.__version__}, "
                  f"libxlog_cuda {xlog_cuda.version()}")
        else:
            import xlog_cuda

            print(f"xlog_cuda {xlog_cuda.__version__} ({_paths.__file__.rsplit('/', 1)[0]})")
            print(f"library      {xlog_cuda.library_path()}")
            for name, get in (("cmake dir", _paths.get_cmake_dir), ("include dir", _paths.get_include_dir),
                              ("lib dir", _paths.get_lib_dir), ("pkgconfig", _paths.get_pkgconfig_dir)):
                try:
                    print(f"{name:<12} {get()}")
                except _paths.NotBundledError:
                    print(f"{name:<12} (not bundled: a source checkout)")
    except _paths.NotBundledError as e:
        print(f"python -m xlog_cuda: {e}", file=sys.stderr)
        return 1
    except ImportError as e:  # LibraryNotFoundError included
        print(f"python -m xlog_cuda: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
