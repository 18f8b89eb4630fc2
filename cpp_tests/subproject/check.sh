#!/usr/bin/env bash
# ctest build_options:  check.sh SOURCE_DIR WORK_DIR CARGO_TARGET_DIR
#
# CMake's BUILD_TESTING convention (issue 18, item 6), checked the way a
# user meets it, with GoogleTest made unfindable throughout:
#  1. top level, -DBUILD_TESTING=OFF: configure, build and install the
#     library; no test registered, no test binary built;
#  2. as a subproject (cpp_tests/subproject, add_subdirectory) of a parent
#     with BUILD_TESTING on: xlog registers none of its tests, the parent's
#     program links xlog::cuda and runs.
# The cargo target dir is the main build's, so cargo has nothing to redo.
set -euo pipefail
src=$1 work=$2 target_dir=$3
fail() { echo "build_options: FAIL: $*" >&2; exit 1; }
common=(-G Ninja -DCMAKE_BUILD_TYPE=Release "-DXLOG_CARGO_TARGET_DIR=$target_dir"
        -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON -DXLOG_ENABLE_CUDA=OFF)

rm -rf "$work"
mkdir -p "$work"

echo "== 1. top level, BUILD_TESTING=OFF, no GoogleTest"
cmake -S "$src" -B "$work/alone" "${common[@]}" -DBUILD_TESTING=OFF -DXLOG_BUILD_DEMO=OFF > "$work/alone.log" 2>&1 \
  || { cat "$work/alone.log"; fail "configure failed"; }
grep -q "xlog: tests OFF, demo OFF" "$work/alone.log" || fail "configure did not turn the tests off"
cmake --build "$work/alone" > "$work/alone-build.log" 2>&1 || { cat "$work/alone-build.log"; fail "build failed"; }
cmake --install "$work/alone" --prefix "$work/prefix" > /dev/null || fail "install failed"
[ -f "$work/prefix/lib/cmake/XlogCuda/XlogCudaConfig.cmake" ] || fail "nothing installed"
tests=$(ctest --test-dir "$work/alone" -N | sed -n 's/^Total Tests: //p')
[ "${tests:-0}" = 0 ] || fail "$tests tests registered with BUILD_TESTING=OFF"
built=$(find "$work/alone" -type f -executable \( -name '*_test' -o -name xlog_demo \) | head -n 5)
[ -z "$built" ] || fail "test or demo binaries were built: $built"
echo "configured, built and installed the library alone: 0 tests, no test binaries"

echo "== 2. subproject of a parent with BUILD_TESTING=ON, no GoogleTest"
cmake -S "$src/cpp_tests/subproject" -B "$work/parent" "${common[@]}" -DBUILD_TESTING=ON \
  "-DXLOG_SOURCE_DIR=$src" > "$work/parent.log" 2>&1 || { cat "$work/parent.log"; fail "configure failed"; }
grep -q "xlog: tests OFF, demo OFF" "$work/parent.log" || fail "xlog did not leave its tests and demo out as a subproject"
cmake --build "$work/parent" > "$work/parent-build.log" 2>&1 || { cat "$work/parent-build.log"; fail "build failed"; }
listed=$(ctest --test-dir "$work/parent" -N)
[[ "$listed" == *"Total Tests: 1"* ]] || fail "expected only the parent's test, got: $listed"
ctest --test-dir "$work/parent" -V > "$work/parent-ctest.log" 2>&1 \
  || { cat "$work/parent-ctest.log"; fail "the parent's test failed"; }
grep -q "parent_app OK" "$work/parent-ctest.log" || { cat "$work/parent-ctest.log"; fail "parent_app did not run"; }
echo "build_options: OK"
