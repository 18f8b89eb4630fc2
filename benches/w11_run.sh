#!/usr/bin/env bash
# benches/w11_run.sh — W11 (issue 24) on the GPU machine: builds
# benches/w11_engine.cu against a prebuilt libxlog_cuda.so, runs every
# allocator in its own process (a clean NVML device peak each), W11_RUNS
# times in turn, collects the JSON lines and prints one table.
#
#   benches/w11_run.sh OUT_DIR
#
# Results in OUT_DIR: w11.jsonl (one JSON line per process), w11_table.md
# (the table, also printed), logs/ (configure, build and each run's stderr).
#
# Environment:
#   W11_LIB         the prebuilt library (default .gpu/libxlog_cuda.so, else
#                   .prebuilt/libxlog_cuda.so)
#   W11_ALLOCATORS  space-separated specs (default "xlog raw raw-max rmm-pool");
#                   a spec is NAME or NAME+VAR=VALUE+..., the variables set
#                   for that process only and the whole spec its label, e.g.
#                   "xlog xlog+XLOG_CACHE=0 xlog+XLOG_MEMORY=arena raw raw-max"
#   W11_RUNS        processes per spec (default 2); the specs take turns
#   W11_ARGS        more arguments for w11_engine (e.g. "--rounds 31 --queries 48")
#   W11_TIMEOUT     seconds per process (default 90)
#   W11_BUILD       build directory (default build-w11)
#   RMM_ROOT        unpacked librmm-cu13 + rapids-logger wheels; by default the
#                   wheels are looked for in .whl/ and .gpu/ and unpacked into
#                   /tmp/w11-rmm. Without them rmm-pool is left out (said so).
# XLOG_* variables of the caller (XLOG_MEMORY, XLOG_BUDGET_BYTES, ...) reach
# every process; only xlog reads them.
#
# With RMM, every allocator runs from w11_engine_rmm, so that all of them
# use the same CUB (RMM's CCCL) and only the allocator differs.
#
# Exit status: 0 when every process ran with right results, 1 otherwise,
# 77 without a GPU.

set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
if [[ $# -ne 1 || "$1" == -h || "$1" == --help ]]; then
  sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  [[ $# -eq 1 ]] && exit 0 || exit 2
fi
out="$1"
mkdir -p "$out/logs" || exit 1
out="$(cd "$out" && pwd)"
PYTHON="${PYTHON:-python3}"
started=$(date +%s)
say() { echo "w11_run [$(( $(date +%s) - started ))s]: $*" >&2; }

lib="${W11_LIB:-}"
if [[ -z "$lib" ]]; then
  for candidate in "$repo/.gpu/libxlog_cuda.so" "$repo/.prebuilt/libxlog_cuda.so"; do
    [[ -f "$candidate" ]] && { lib="$candidate"; break; }
  done
fi
if [[ -z "$lib" || ! -f "$lib" ]]; then
  say "error: no prebuilt libxlog_cuda.so (.gpu/ or .prebuilt/, or set W11_LIB)"
  exit 1
fi
lib="$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")"
if [[ -d /usr/local/nvidia/lib64 && ":${LD_LIBRARY_PATH:-}:" != *":/usr/local/nvidia/lib64:"* ]]; then
  export LD_LIBRARY_PATH="/usr/local/nvidia/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
if ! command -v nvcc >/dev/null 2>&1 && [[ -z "${CUDACXX:-}" && -x /usr/local/cuda/bin/nvcc ]]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi

# ---- RMM ------------------------------------------------------------------
rmm_root="${RMM_ROOT:-}"
if [[ -z "$rmm_root" ]]; then
  rmm_wheel="$(ls .whl/librmm_cu13-*.whl .gpu/librmm_cu13-*.whl 2>/dev/null | head -n 1)"
  logger_wheel="$(ls .whl/rapids_logger-*.whl .gpu/rapids_logger-*.whl 2>/dev/null | head -n 1)"
  if [[ -n "$rmm_wheel" && -n "$logger_wheel" ]]; then
    rmm_root=/tmp/w11-rmm
    rm -rf "$rmm_root" && mkdir -p "$rmm_root"
    if ! "$PYTHON" -m zipfile -e "$rmm_wheel" "$rmm_root" || ! "$PYTHON" -m zipfile -e "$logger_wheel" "$rmm_root"; then
      say "could not unpack the RMM wheels; rmm-pool is left out"
      rmm_root=""
    fi
  fi
fi

# ---- build ----------------------------------------------------------------
build="${W11_BUILD:-$repo/build-w11}"
say "configuring into $build (library $lib${rmm_root:+, RMM from $rmm_root})"
if ! cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "-DXLOG_PREBUILT_LIB=$lib" \
     "-DRMM_ROOT=$rmm_root" >"$out/logs/configure.log" 2>&1; then
  tail -n 30 "$out/logs/configure.log" >&2
  say "error: cmake configure failed (see $out/logs/configure.log)"
  exit 1
fi
targets=(w11_engine)
ninja -C "$build" -t targets all 2>/dev/null | grep -q '^w11_engine_rmm:' && targets+=(w11_engine_rmm)
say "building ${targets[*]}"
ninja -C "$build" -k 0 "${targets[@]}" >"$out/logs/build.log" 2>&1
plain="$build/benches/w11_engine"
with_rmm="$build/benches/w11_engine_rmm"
if [[ -x "$with_rmm" ]] && "$with_rmm" --list 2>/dev/null | grep -qx rmm-pool; then
  bin="$with_rmm"
elif [[ -x "$plain" ]]; then
  bin="$plain"
  [[ -n "$rmm_root" ]] && say "w11_engine_rmm did not build or load (see $out/logs/build.log); rmm-pool is left out"
else
  grep -E 'error|FAILED' "$out/logs/build.log" | head -n 40 >&2
  say "error: w11_engine did not build (see $out/logs/build.log)"
  exit 1
fi
say "binary $bin"

# ---- run ------------------------------------------------------------------
read -r -a specs <<<"${W11_ALLOCATORS:-xlog raw raw-max rmm-pool}"
runs="${W11_RUNS:-2}"
read -r -a extra <<<"${W11_ARGS:-}"
available="$("$bin" --list)"
jsonl="$out/w11.jsonl"
: >"$jsonl"
failed=0
for ((run = 1; run <= runs; run++)); do
  for spec in "${specs[@]}"; do
    IFS='+' read -r -a parts <<<"$spec"
    name="${parts[0]}"
    assignments=("${parts[@]:1}")
    if ! grep -qx -- "$name" <<<"$available"; then
      [[ $run -eq 1 ]] && say "$spec: $name is not in this build ($(tr '\n' ' ' <<<"$available")); left out"
      [[ $run -eq 1 ]] && printf '{"workload":"W11","allocator":"%s","label":"%s","status":"missing","error":"not in this build"}\n' \
        "$name" "$spec" >>"$jsonl"
      continue
    fi
    log="$out/logs/$(printf '%s' "$spec" | tr -c 'A-Za-z0-9_.=-' '_')-run$run.log"
    say "run $run/$runs: $spec"
    line="$(env "${assignments[@]}" timeout "${W11_TIMEOUT:-90}" "$bin" --allocator "$name" --label "$spec" \
            "${extra[@]}" 2>"$log")"
    rc=$?
    if [[ $rc -eq 77 ]]; then
      cat "$log" >&2
      say "no GPU here: nothing measured"
      exit 77
    fi
    tail -n 1 "$log" >&2
    if [[ -n "$line" ]]; then
      printf '%s\n' "$line" >>"$jsonl"
    else
      printf '{"workload":"W11","allocator":"%s","label":"%s","status":"error","error":"exit %d, no output (124 = timed out); see %s"}\n' \
        "$name" "$spec" "$rc" "$log" >>"$jsonl"
    fi
    [[ $rc -ne 0 ]] && failed=1
  done
done

# ---- table ----------------------------------------------------------------
"$PYTHON" - "$jsonl" "$out/w11_table.md" "$bin" <<'EOF'
import json, statistics, sys

jsonl, table_path, binary = sys.argv[1:4]
rows = [json.loads(line) for line in open(jsonl) if line.strip()]
MiB = 1024.0 * 1024.0

def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None

def fmt(value, scale=1.0, digits=1):
    return "-" if value is None else f"{value / scale:.{digits}f}"

def spread(values, scale=1.0, digits=1):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    lo, hi = min(values) / scale, max(values) / scale
    mid = statistics.median(values) / scale
    return f"{mid:.{digits}f}" if len(values) == 1 else f"{mid:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f})"

labels = []
for r in rows:
    if r.get("label") not in labels:
        labels.append(r.get("label"))
ok = [r for r in rows if r.get("status") == "ok"]
by_label = {label: [r for r in ok if r.get("label") == label] for label in labels}

# The reference for the ratios: the better raw cudaMallocAsync (time and
# peak each), as issue 24's targets read "<= 1.00x raw".
def best(field, names):
    values = [median([r.get(field) for r in by_label.get(n, [])]) for n in names]
    values = [v for v in values if v is not None]
    return min(values) if values else None
raw_time = best("round_ms_median", ["raw", "raw-max"])
raw_peak = best("device_peak_bytes", ["raw", "raw-max"])

lines = []
first = ok[0] if ok else {}
lines.append(f"W11 engine workload: {first.get('queries', '?')} queries per round, median of "
             f"{first.get('rounds', '?')} rounds per process, {first.get('streams', '?')} streams, "
             f"fact rows 2^{str(first.get('fact_log2', '?')).replace(':', '..2^')}, seed {first.get('seed', '?')}, "
             f"CUB {first.get('cub_version', '?')}; binary {binary}")
lines.append("Time: median over processes of each process's median round (range over processes). "
             "Device peak: NVML used above the process's baseline. Ratios against the better of raw / raw-max.")
lines.append("")
lines.append("| allocator | runs ok | ms / round | x raw | device peak MiB | x raw | peak live MiB | "
             "peak charged MiB | held MiB (peak) | allocs / round |")
lines.append("|---|---|---|---|---|---|---|---|---|---|")
for label in labels:
    runs = by_label[label]
    total = sum(1 for r in rows if r.get("label") == label)
    t = median([r.get("round_ms_median") for r in runs])
    p = median([r.get("device_peak_bytes") for r in runs])
    live = [r.get("peak_live_bytes", r.get("pool_used_high_bytes")) for r in runs]
    held = [r.get("peak_held_bytes") for r in runs]
    lines.append("| " + " | ".join([
        str(label), f"{len(runs)}/{total}",
        spread([r.get("round_ms_median") for r in runs], 1.0, 2),
        "-" if t is None or not raw_time else f"{t / raw_time:.2f}",
        spread([r.get("device_peak_bytes") for r in runs], MiB, 0),
        "-" if p is None or not raw_peak else f"{p / raw_peak:.2f}",
        spread(live, MiB, 0),
        spread([r.get("peak_outstanding_bytes") for r in runs], MiB, 0),
        spread(held, MiB, 0),
        fmt(median([r.get("allocations_per_round") for r in runs]), 1.0, 0),
    ]) + " |")
lines.append("")
lines.append("peak live: xlog's peak_live_bytes; for raw/raw-max the driver pool's used-memory high watermark.")
checksums = sorted({r.get("checksum") for r in ok})
wrong = [r for r in rows if r.get("status") not in ("ok", "missing")]
if len(checksums) == 1:
    lines.append(f"Results: the same checksum {checksums[0]} in all {len(ok)} processes "
                 f"(each also checked every round against round 1 and round 1 against the host).")
elif checksums:
    lines.append("Results DIFFER between processes: " + ", ".join(
        f"{r.get('label')}={r.get('checksum')}" for r in ok))
for r in wrong:
    lines.append(f"FAILED: {r.get('label')}: {r.get('status')}: {r.get('error', '')}")
for r in rows:
    if r.get("status") == "missing":
        lines.append(f"left out: {r.get('label')}: {r.get('error')}")
text = "\n".join(lines) + "\n"
open(table_path, "w").write(text)
sys.stdout.write(text)
sys.exit(0 if len(checksums) <= 1 and not wrong else 1)
EOF
table_rc=$?
say "results in $out (w11.jsonl, w11_table.md, logs/)"
[[ $failed -eq 0 && $table_rc -eq 0 ]] || exit 1
exit 0
