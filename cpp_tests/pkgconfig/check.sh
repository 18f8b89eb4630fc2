#!/usr/bin/env bash
# ctest package_pkgconfig:  check.sh BUILD_DIR WORK_DIR VERSION
#
# Installs BUILD_DIR into a fresh prefix, moves the prefix elsewhere (the
# .pc file's paths are relative to itself), then builds main.c the way a C
# user without CMake does, with README's line,
#
#   cc main.c $(pkg-config --cflags --libs xlog-cuda) -Wl,-rpath,$(pkg-config --variable=libdir xlog-cuda)
#
# and runs it as a user would, with no LD_LIBRARY_PATH: the rpath must be
# what finds libxlog_cuda.so.0. Exits 77 (skipped) where pkg-config is not
# installed; CI installs it. CC overrides the compiler.
set -euo pipefail
build_dir=$1 work=$2 version=$3
here="$(cd "$(dirname "$0")" && pwd)"
fail() { echo "package_pkgconfig: FAIL: $*" >&2; exit 1; }

command -v pkg-config >/dev/null || { echo "pkg-config is not installed: skipped"; exit 77; }

rm -rf "$work"
mkdir -p "$work"
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null

# Beside the CMake package, as distributions and wheels lay it out.
pc=$(find "$work/prefix" -name xlog-cuda.pc)
[ -n "$pc" ] || fail "no xlog-cuda.pc installed under $work/prefix"
pcdir=$(dirname "$pc")
[ -f "$pcdir/../cmake/XlogCuda/XlogCudaConfig.cmake" ] || fail "$pc is not beside lib*/cmake/XlogCuda"
rel=${pcdir#"$work/prefix/"}

mv "$work/prefix" "$work/moved"
export PKG_CONFIG_PATH="$work/moved/$rel"
unset PKG_CONFIG_LIBDIR PKG_CONFIG_SYSROOT_DIR

got=$(pkg-config --modversion xlog-cuda)
[ "$got" = "$version" ] || fail "pkg-config --modversion gives '$got', expected '$version'"
libdir=$(pkg-config --variable=libdir xlog-cuda)
includedir=$(pkg-config --variable=includedir xlog-cuda)
[ -f "$includedir/xlog_cuda.h" ] || fail "includedir '$includedir' has no xlog_cuda.h (not relocated?)"
[ -e "$libdir/libxlog_cuda.so" ] || fail "libdir '$libdir' has no libxlog_cuda.so"
case "$libdir" in "$work/moved"/*) ;; *) fail "libdir '$libdir' is outside the moved prefix" ;; esac
echo "pkg-config --cflags --libs xlog-cuda: $(pkg-config --cflags --libs xlog-cuda)"

cd "$work"
# shellcheck disable=SC2046 # word splitting of pkg-config's output is the point
"${CC:-cc}" -std=c99 -Wall -Wextra -Werror "$here/main.c" $(pkg-config --cflags --libs xlog-cuda) \
  -Wl,-rpath,$(pkg-config --variable=libdir xlog-cuda) -o consumer_pkgconfig
readelf -d consumer_pkgconfig | grep -q 'NEEDED.*\[libxlog_cuda.so.0\]' || fail "consumer has no DT_NEEDED libxlog_cuda.so.0"
readelf -d consumer_pkgconfig | grep -E 'RPATH|RUNPATH' | grep -qF "[$libdir]" || fail "consumer has no rpath $libdir"
# As a user runs it: nothing in the environment points at the library.
out=$(env -u LD_LIBRARY_PATH XLOG_BACKEND=sim ./consumer_pkgconfig)
echo "$out"
case "$out" in *"pkgconfig OK"*) ;; *) fail "the program did not report success" ;; esac
echo "package_pkgconfig: OK"
