#!/usr/bin/env python3
"""Build the wheel, install it into a fresh venv, and use it as a user would
(ctest `package_wheel`; issue 14, item 1).

    scripts/check_wheel.py --work DIR [--wheel FILE] [--python PY]

1. Builds the wheel from the repository root (`pip wheel .`, with the build
   backend already installed: --no-build-isolation) unless --wheel gives
   one. CARGO_TARGET_DIR, when set, is reused, so cargo has nothing to redo
   after scripts/test's build.
2. Gives it an honest platform tag: `auditwheel show` finds the manylinux
   policy its symbol versions allow and `auditwheel repair` retags it (no
   library needs grafting: libxlog_cuda needs only libc and libgcc_s).
   Without auditwheel the wheel keeps linux_x86_64 and this says so.
3. Installs it into a fresh venv (no index: nothing else is needed).
4. From a directory outside the repository, with XLOG_CUDA_LIBRARY and
   PYTHONPATH unset: checks that `import xlog_cuda` loads the bundled copy,
   runs the README's Python snippets, and checks `python -m xlog_cuda
   --cmake-dir/--include-dir/--lib-dir/--pkgconfig-dir`.
5. Builds cpp_tests/consumer with -DCMAKE_PREFIX_PATH=$(python -m xlog_cuda
   --cmake-dir) and runs both programs; checks find_package took the
   wheel's config and that pkg-config finds the wheel's xlog-cuda.pc.

On a machine without Rust (the GPU machine), pass --wheel with a wheel
built here (ctest leaves it in build/package_test/wheel/repaired/): steps
3 to 5 are the same check, and --gpu adds an allocation on the CUDA
backend through the installed package. Exit 0 when everything
passed, 1 on a failure, 77 (skipped) when the build backend
(scikit-build-core) is not installed and no --wheel was given.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP = 77


def log(message: str) -> None:
    print(f"check_wheel: {message}", flush=True)


def fail(message: str) -> "None":
    print(f"check_wheel: FAIL: {message}", flush=True)
    sys.exit(1)


def run(cmd, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        fail(f"{' '.join(map(str, cmd))} exited {p.returncode}:\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}")
    return p


def clean_env(extra=None):
    """The environment a user has: no XLOG_* settings, no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLOG_") and k not in ("PYTHONPATH", "PYTHONHOME")}
    env["XLOG_BACKEND"] = "sim"
    env.update(extra or {})
    return env


def build_wheel(python: str, work: str) -> str:
    try:
        import scikit_build_core  # noqa: F401
    except ImportError:
        log("scikit-build-core is not installed (python -m pip install scikit-build-core): skipped")
        sys.exit(SKIP)
    dist = os.path.join(work, "dist")
    started = time.monotonic()
    # The build runs in-tree; its CMake build directory is a temporary one.
    run([python, "-m", "pip", "wheel", REPO, "--no-build-isolation", "--no-deps", "-w", dist],
        env={**os.environ, "PIP_NO_INPUT": "1"}, cwd=work)
    wheels = glob.glob(os.path.join(dist, "xlog_cuda-*.whl"))
    if len(wheels) != 1:
        fail(f"expected one wheel in {dist}, found {wheels}")
    log(f"built {os.path.basename(wheels[0])} in {time.monotonic() - started:.1f} s")
    return wheels[0]


def retag(python: str, wheel: str, work: str) -> str:
    if "-manylinux_" in os.path.basename(wheel):
        log(f"{os.path.basename(wheel)} is tagged manylinux already")
        return wheel
    if shutil.which("auditwheel") is None and subprocess.run(
            [python, "-c", "import auditwheel"], capture_output=True).returncode != 0:
        log("auditwheel is not installed: the wheel keeps its linux_x86_64 tag (not installable from an index "
            "that requires manylinux, fine for pip install of the file)")
        return wheel
    show = run([python, "-m", "auditwheel", "show", wheel]).stdout
    policy = None
    for line in show.replace("\n", " ").split('"'):
        if line.startswith("manylinux_") or line.startswith("musllinux_"):
            policy = line
            break
    if policy is None:
        fail(f"auditwheel show found no manylinux policy for {wheel}:\n{show}")
    out = os.path.join(work, "repaired")
    run([python, "-m", "auditwheel", "repair", "--plat", policy, "-w", out, wheel])
    repaired = glob.glob(os.path.join(out, "xlog_cuda-*.whl"))
    if len(repaired) != 1 or policy not in os.path.basename(repaired[0]):
        fail(f"auditwheel repair did not give one {policy} wheel: {repaired}")
    log(f"auditwheel: {policy} (the glibc symbol versions libxlog_cuda uses allow no older policy)")
    return repaired[0]


def check_contents(wheel: str) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        infos = {i.filename: i for i in z.infolist()}
    want = [
        "xlog_cuda/__init__.py",
        "xlog_cuda/__main__.py",
        "xlog_cuda/lib/libxlog_cuda.so",
        "xlog_cuda/lib/libxlog_cuda.so.0",
        "xlog_cuda/include/xlog_cuda.h",
        "xlog_cuda/include/xlog/runtime.hpp",
        "xlog_cuda/lib/cmake/XlogCuda/XlogCudaConfig.cmake",
        "xlog_cuda/lib/cmake/XlogCuda/XlogCudaConfigVersion.cmake",
        "xlog_cuda/lib/pkgconfig/xlog-cuda.pc",
    ]
    missing = [n for n in want if n not in names]
    if missing:
        fail(f"{os.path.basename(wheel)} lacks {missing}")
    licenses = [n for n in names if re.fullmatch(r"xlog_cuda-[^/]+\.dist-info/licenses/LICENSE", n)]
    if not licenses:
        fail(f"{os.path.basename(wheel)} carries no LICENSE in its dist-info")
    with zipfile.ZipFile(wheel) as z:
        if b"Apache License" not in z.read(licenses[0]):
            fail(f"{licenses[0]} is not the Apache-2.0 text")
    debug = [n for n in names if n.endswith(".debug")]
    if debug:
        fail(f"the wheel carries debug files {debug}")
    size = infos["xlog_cuda/lib/libxlog_cuda.so.0"].file_size
    if size > 4 << 20:
        fail(f"libxlog_cuda.so.0 in the wheel is {size} bytes: not stripped?")
    log(f"contents ok: library {size} bytes (stripped), headers, CMake package, pkg-config file, LICENSE")


PROBE = r"""
import json, os, sys
import xlog_cuda, xlog_cuda._library as L
print(json.dumps({"package": os.path.realpath(xlog_cuda.__file__), "library": xlog_cuda.library_path(),
                  "version": xlog_cuda.version(), "prefix": L.bundled_prefix()}))
"""


GPU_PROBE = r"""
import xlog_cuda as xc
with xc.Runtime(0, backend="cuda", budget_bytes="64MiB") as rt:
    assert rt.backend == "cuda", rt.backend
    with rt.acquire_stream() as s:
        b = rt.allocate(1 << 20, s, tag="wheel-check")
        assert b.ptr and b.size == 1 << 20
        b.free()
        released = rt.drain()
    st = rt.stats()
    assert st.live_bytes == 0 and st.allocations == 1, st
print(f"allocated and freed 1 MiB on the CUDA backend through {xc.library_path()}")
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", required=True, help="scratch directory (emptied first)")
    ap.add_argument("--wheel", help="check this wheel instead of building one")
    ap.add_argument("--python", default=sys.executable, help="interpreter that builds and makes the venv")
    ap.add_argument("--cmake", default=shutil.which("cmake") or "cmake")
    ap.add_argument("--generator", default="Ninja" if shutil.which("ninja") else "Unix Makefiles")
    ap.add_argument("--gpu", action="store_true", help="also allocate on the CUDA backend (a GPU machine)")
    args = ap.parse_args()

    work = os.path.abspath(args.work)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    started = time.monotonic()

    wheel = os.path.abspath(args.wheel) if args.wheel else build_wheel(args.python, work)
    wheel = retag(args.python, wheel, work)
    check_contents(wheel)

    venv = os.path.join(work, "venv")
    made = subprocess.run([args.python, "-m", "venv", venv], capture_output=True, text=True)
    if made.returncode == 0:
        py = os.path.join(venv, "bin", "python")
        run([py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", wheel], env=clean_env())
        env = clean_env()
        log(f"installed into a fresh venv ({venv})")
    else:
        # An interpreter without ensurepip (Debian/Ubuntu without
        # python3-venv): install into a fresh directory instead.
        target = os.path.join(work, "site")
        run([args.python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", target, wheel],
            env=clean_env())
        py = args.python
        env = clean_env({"PYTHONPATH": target})
        venv = target
        log(f"no venv module ({made.stderr.strip().splitlines()[-1] if made.stderr.strip() else made.returncode}); "
            f"installed with pip --target {target}")

    outside = os.path.join(work, "elsewhere")
    os.makedirs(outside)
    import json

    probe = json.loads(run([py, "-c", PROBE], cwd=outside, env=env).stdout.strip().splitlines()[-1])
    site = os.path.realpath(venv)
    if not probe["package"].startswith(site):
        fail(f"import xlog_cuda took {probe['package']}, not the venv's copy under {site}")
    if not (probe["prefix"] and probe["library"].startswith(os.path.realpath(probe["prefix"]))):
        fail(f"the library loaded is {probe['library']}, not the bundled copy in {probe['prefix']}")
    log(f"import xlog_cuda loads the bundled {probe['library']} (libxlog_cuda {probe['version']}), no variable set")

    snippets = run([py, os.path.join(REPO, "cpp_tests", "readme", "run_python_snippets.py"),
                    os.path.join(REPO, "README.md")], cwd=outside, env=env)
    log("README Python snippets: " + " | ".join(l for l in snippets.stdout.splitlines() if "README.md" in l))

    dirs = {}
    for flag in ("--cmake-dir", "--include-dir", "--lib-dir", "--pkgconfig-dir"):
        out = run([py, "-m", "xlog_cuda", flag], cwd=outside, env=env).stdout.strip()
        if not (os.path.isdir(out) and os.path.realpath(out).startswith(os.path.realpath(probe["prefix"]))):
            fail(f"python -m xlog_cuda {flag} printed {out!r}, not a directory of the installed package")
        dirs[flag] = out
    if not os.path.isfile(os.path.join(dirs["--cmake-dir"], "XlogCudaConfig.cmake")):
        fail(f"{dirs['--cmake-dir']} holds no XlogCudaConfig.cmake")
    if not os.path.isfile(os.path.join(dirs["--include-dir"], "xlog_cuda.h")):
        fail(f"{dirs['--include-dir']} holds no xlog_cuda.h")
    log("python -m xlog_cuda: " + ", ".join(f"{k} {v}" for k, v in dirs.items()))

    # A downstream CMake project against the wheel, as its README line says:
    #   cmake -DCMAKE_PREFIX_PATH=$(python -m xlog_cuda --cmake-dir)
    build = os.path.join(work, "consumer")
    run([args.cmake, "-S", os.path.join(REPO, "cpp_tests", "consumer"), "-B", build, "-G", args.generator,
         f"-DCMAKE_PREFIX_PATH={dirs['--cmake-dir']}",
         "-DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF", "-DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF"], env=env)
    run([args.cmake, "--build", build], env=env)
    cache = open(os.path.join(build, "CMakeCache.txt")).read()
    found = [l.split("=", 1)[1] for l in cache.splitlines() if l.startswith("XlogCuda_DIR:")]
    if not found or os.path.realpath(found[0]) != os.path.realpath(dirs["--cmake-dir"]):
        fail(f"find_package(XlogCuda) used {found}, not the wheel's {dirs['--cmake-dir']}")
    for program in ("consumer_c", "consumer_cpp"):
        out = run([os.path.join(build, program)], cwd=outside, env=env).stdout
        if f"{program} OK" not in out:
            fail(f"{program} did not report success: {out}")
    log(f"cpp_tests/consumer built against {found[0]} and ran (consumer_c, consumer_cpp)")

    if args.gpu:
        out = run([py, "-c", GPU_PROBE], cwd=outside, env={**env, "XLOG_BACKEND": "cuda"}).stdout.strip()
        log(f"on the GPU: {out.splitlines()[-1]}")

    if shutil.which("pkg-config"):
        cflags = run(["pkg-config", "--cflags", "--libs", "xlog-cuda"],
                     env={**env, "PKG_CONFIG_PATH": dirs["--pkgconfig-dir"]}).stdout.split()
        want_i = "-I" + os.path.realpath(dirs["--include-dir"])
        if not any(os.path.realpath(f[2:]) == want_i[2:] for f in cflags if f.startswith("-I")):
            fail(f"pkg-config over the wheel gives {cflags}, without {want_i}")
        log(f"pkg-config over the wheel: {' '.join(cflags)}")

    log(f"OK in {time.monotonic() - started:.1f} s ({os.path.basename(wheel)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
