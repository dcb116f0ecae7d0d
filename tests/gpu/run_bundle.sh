#!/usr/bin/env bash
# The GPU check, run from a bundle made by tests/gpu/bundle.sh: no Bazel, no
# build, no network, no Debian -dev libraries needed; the machine provides
# glibc (or the bundle's own, see below), the NVIDIA driver and the CUDA 13
# libraries (libcudart, libcublas, libcublasLt). Steps, each with a timeout,
# all together under 5 minutes:
#   unpack        the bundle's archive (xz, or python3 when xz is missing),
#                 checked against its SHA256SUMS
#   libraries     every bundled binary resolves every library from the
#                 bundle, glibc or the CUDA libraries found on the machine
#   gpu           nvidia-smi lists a GPU (its name picks the fp32 peak)
#   startup       ps_server serves, ps_worker --version, backend_bench runs
#   parity        cuda_parity_test with ASYNCPS_REQUIRE_CUDA=1: CUDA vs CPU,
#                 op by op, one MLP step, error reporting
#   bench         backend_bench CUDA vs CPU: examples/s of 784-256-128-10
#                 and 784-4096-4096-10 at batch 64 and 1024, GEMM TFLOP/s
#                 and their fraction of the fp32 peak
#   cluster-1     2 ps_server shards + 1 GPU worker, Fashion-MNIST, 2 epochs
#   cluster-4     2 shards + 4 GPU workers (each 2 epochs of its quarter)
# Results in OUTDIR (6 files): summary.txt (one line per step with the key
# numbers, then "N passed, N failed, N skipped"), env.txt (machine, glibc,
# CUDA libraries, nvidia-smi, library resolution), parity.txt, bench.txt,
# bench.csv, cluster.txt (process logs). Exits 1 if a step failed.
#
# Usage: run_bundle.sh [--bundle DIR] [--smoke] OUTDIR
#   --bundle DIR  the bundle folder (default: this script's folder when it
#                 holds the archive, else gpu-bundle/ at the repository root)
#   --smoke       stop after the startup step (bundle verification)
# Environment:
#   ASYNCPS_GPU_OPTIONAL=1  without a usable GPU, run every step on the CPU
#                           (parity then skips) instead of failing: checks
#                           this script on a machine without a GPU
#   ASYNCPS_BUNDLE_GLIBC=1|0  force or forbid the bundle's own glibc (run
#                           through its loader); default: used only when
#                           the machine's glibc is older than the bundle's
#   ASYNCPS_PEAK_TFLOPS=X   the GPU's fp32 peak (default: from its name)
#   ASYNCPS_UNPACK_WITH=python3  unpack with python3 even if xz exists
#   CUDA_HOME               searched first for the CUDA libraries
set -uo pipefail

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

bundle=""
smoke=0
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) bundle="${2:-}"; shift 2 || { usage >&2; exit 2; } ;;
    --smoke) smoke=1; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "run_bundle.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) [ -z "$out" ] || { usage >&2; exit 2; }; out="$1"; shift ;;
  esac
done
[ -n "$out" ] || { usage >&2; exit 2; }

here="$(cd "$(dirname "$0")" && pwd)"
if [ -z "$bundle" ]; then
  if [ -f "$here/asyncps-gpu.tar.xz" ]; then bundle="$here"
  else bundle="$here/../../gpu-bundle"; fi
fi
if [ ! -f "$bundle/asyncps-gpu.tar.xz" ]; then
  echo "run_bundle.sh: no asyncps-gpu.tar.xz in $bundle (make it with" \
    "tests/gpu/bundle.sh, or pass --bundle DIR)" >&2
  exit 2
fi
bundle="$(cd "$bundle" && pwd)"
mkdir -p "$out" || exit 2
out="$(cd "$out" && pwd)"

SUMMARY="$out/summary.txt"
ENV_TXT="$out/env.txt"
: >"$SUMMARY"
: >"$ENV_TXT"
START=$(date +%s)
DEADLINE=$((START + 290))
# The unpacked bundle; beside the bundle when the temporary folder does not
# allow running programs (mounted noexec).
WORK="$(mktemp -d "${TMPDIR:-/tmp}/asyncps-gpu.XXXXXX")"
printf '#!/bin/sh\nexit 0\n' >"$WORK/probe" && chmod +x "$WORK/probe"
if ! "$WORK/probe" 2>/dev/null; then
  rm -rf "$WORK"
  WORK="$(mktemp -d "$bundle/.work.XXXXXX")"
fi
rm -f "$WORK/probe"
PIDS=()  # started and not yet reaped; stopped on exit

cleanup() {
  local pid
  # TERM first: a `timeout` passes it on to the worker it runs.
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  [ ${#PIDS[@]} -eq 0 ] || sleep 1
  for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'echo "interrupted" >>"$SUMMARY"; exit 130' INT TERM

passed=0
failed=0
skipped=0
# record STEP STATUS [DETAIL]: STATUS is ok, skipped or FAILED.
record() {
  local line="$1: $2${3:+ ($3)} [$(($(date +%s) - START)) s]"
  echo "$line" | tee -a "$SUMMARY"
  case "$2" in
    ok) passed=$((passed + 1)) ;;
    skipped) skipped=$((skipped + 1)) ;;
    *) failed=$((failed + 1)) ;;
  esac
}
# limit SECONDS: SECONDS, or less so that the run ends by the deadline.
limit() {
  local left=$((DEADLINE - $(date +%s)))
  [ "$left" -lt "$1" ] && echo $((left > 1 ? left : 1)) || echo "$1"
}
finish() {
  echo "total: $(($(date +%s) - START)) s" | tee -a "$SUMMARY"
  echo "$passed passed, $failed failed, $skipped skipped" | tee -a "$SUMMARY"
  [ "$failed" -eq 0 ]
  exit $?
}

{
  echo "== machine"
  uname -a
  echo "cores: $(nproc)"
  echo "bundle: $bundle"
  cat "$bundle/MANIFEST.txt" 2>/dev/null | sed -n '1,12p'
} >>"$ENV_TXT" 2>&1

# --- unpack ------------------------------------------------------------------
unpack() {
  if [ "${ASYNCPS_UNPACK_WITH:-}" != python3 ] && command -v xz >/dev/null; then
    tar -xJf "$bundle/asyncps-gpu.tar.xz" -C "$WORK"
  elif command -v python3 >/dev/null; then
    python3 -c 'import sys, tarfile
safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
tarfile.open(sys.argv[1]).extractall(sys.argv[2], **safe)' \
      "$bundle/asyncps-gpu.tar.xz" "$WORK"
  else
    echo "neither xz nor python3 is installed: cannot unpack"
    return 1
  fi && (cd "$WORK" && sha256sum --quiet -c SHA256SUMS)
}
if msg=$(unpack 2>&1); then
  record unpack ok "$(wc -l <"$WORK/SHA256SUMS") files, checksums match"
else
  record unpack FAILED "$msg"
  finish
fi
DATA="$bundle/fashion-mnist"

# --- libraries ---------------------------------------------------------------
# CUDA_DIRS: the folders holding the CUDA 13 libraries the binaries link.
cuda_candidates() {
  local d
  [ -n "${CUDA_HOME:-}" ] && echo "$CUDA_HOME/lib64"
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
    /usr/local/cuda-13*/lib64 /usr/local/cuda-13*/targets/x86_64-linux/lib; do
    echo "$d"
  done
  if command -v ldconfig >/dev/null; then
    ldconfig -p 2>/dev/null | sed -n 's/.*libcu\(dart\|blas\|blasLt\)\.so\.13 .*=> \(.*\)\/[^/]*$/\2/p'
  fi
  if command -v python3 >/dev/null; then  # pip wheels (e.g. PyTorch's)
    python3 -c 'import glob, site
for p in site.getsitepackages():
    for d in glob.glob(p + "/nvidia/*/lib"): print(d)' 2>/dev/null
  fi
}
CUDA_DIRS=""
missing_cuda=""
for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13; do
  found=""
  while read -r d; do
    if [ -e "$d/$lib" ]; then found="$d"; break; fi
  done < <(cuda_candidates)
  if [ -z "$found" ]; then
    missing_cuda="$missing_cuda $lib"
  else
    case ":$CUDA_DIRS:" in *":$found:"*) ;; *) CUDA_DIRS="${CUDA_DIRS:+$CUDA_DIRS:}$found" ;; esac
  fi
done

# glibc: the machine's, unless it is older than the bundle needs.
need_glibc=$(cat "$WORK/GLIBC_REQUIRED")
have_glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null) && have_glibc="${have_glibc##* }"
older=0
if [ -z "$have_glibc" ] ||
    [ "$(printf '%s\n%s\n' "$need_glibc" "$have_glibc" | sort -V | head -n1)" != "$need_glibc" ]; then
  older=1
fi
use_own_glibc="${ASYNCPS_BUNDLE_GLIBC:-$older}"
LOADER=""
LIBPATH="$WORK/lib${CUDA_DIRS:+:$CUDA_DIRS}"
if [ "$use_own_glibc" = 1 ]; then
  LOADER="$WORK/glibc/ld-linux-x86-64.so.2"
  LIBPATH="$WORK/glibc:$LIBPATH"
fi
# RUN: the prefix that starts a bundled binary; the library path is set for
# that process only (the machine's own programs keep their libraries).
RUN=(env "LD_LIBRARY_PATH=$LIBPATH")
own=""
if [ -n "$LOADER" ]; then
  RUN+=("$LOADER")
  own=", bundle's own glibc"
fi
{
  echo "== glibc: machine ${have_glibc:-unknown}, bundle needs $need_glibc$own"
  echo "== CUDA libraries: ${CUDA_DIRS:-none}${missing_cuda:+ (missing:$missing_cuda)}"
} >>"$ENV_TXT"

# check_libs BINARY: lists its libraries; fails on one that is missing or
# comes from anywhere but the bundle, the CUDA folders or glibc.
GLIBC_LIBS=" libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1 libresolv.so.2 libutil.so.1 ld-linux-x86-64.so.2 "
check_libs() {
  local listing bad="" line name path
  if [ -n "$LOADER" ]; then
    listing=$(env "LD_LIBRARY_PATH=$LIBPATH" "$LOADER" --list "$1" 2>&1) || bad="rc=$? "
  else
    listing=$(env "LD_LIBRARY_PATH=$LIBPATH" ldd "$1" 2>&1) || bad="rc=$? "
  fi
  echo "-- $(basename "$1")"
  echo "$listing"
  while read -r line; do
    case "$line" in
      *"not found"*) bad="$bad${line%% *} not found; "; continue ;;
      *" => "*) name="${line%% =>*}"; path="${line#*=> }"; path="${path%% (*}" ;;
      /*) path="${line%% (*}"; name="$(basename "$path")" ;;
      *) continue ;;  # linux-vdso and statically linked notes
    esac
    case "$path" in "$WORK"/*) continue ;; esac
    case ":$CUDA_DIRS:" in *":$(dirname "$path"):"*) continue ;; esac
    case "$GLIBC_LIBS" in *" $name "*) continue ;; esac
    bad="$bad$name from $path; "
  done <<<"$listing"
  [ -z "$bad" ] || { echo "PROBLEM: $bad"; return 1; }
}
lib_problems=""
echo "== library resolution" >>"$ENV_TXT"
for b in "$WORK"/bin/*; do
  if ! check_libs "$b" >>"$ENV_TXT" 2>&1; then
    lib_problems="$lib_problems $(basename "$b")"
  fi
done
if [ -n "$missing_cuda" ]; then
  record libraries FAILED "CUDA libraries not found:$missing_cuda (set CUDA_HOME)"
  finish
elif [ -n "$lib_problems" ]; then
  record libraries FAILED "unresolved or foreign libraries in:$lib_problems; see env.txt"
  finish
fi
record libraries ok \
  "glibc ${have_glibc:-?} (bundle needs $need_glibc)$own; CUDA from $CUDA_DIRS"

# --- gpu ---------------------------------------------------------------------
gpu=0
gpu_name=""
if command -v nvidia-smi >/dev/null &&
    timeout 20 nvidia-smi -L >"$WORK/smi.txt" 2>&1 && grep -q '^GPU ' "$WORK/smi.txt"; then
  gpu=1
  gpu_name=$(timeout 20 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1)
  {
    echo "== nvidia-smi"
    cat "$WORK/smi.txt"
    timeout 20 nvidia-smi --format=csv \
      --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit 2>&1
    timeout 20 nvidia-smi 2>&1
  } >>"$ENV_TXT"
else
  { echo "== nvidia-smi: no GPU listed"; cat "$WORK/smi.txt" 2>/dev/null; } >>"$ENV_TXT"
fi
# fp32 (non-tensor-core) peak, NVIDIA's datasheet figures: H100 and H200 SXM
# 67 TFLOP/s (132 SMs x 128 FP32 lanes x 2 FLOP x 1.98 GHz boost), H100 NVL
# and H200 NVL 60, H100 PCIe 51.
case "$gpu_name" in
  *H100*NVL*|*H200*NVL*) peak=60 ;;
  *H100*PCIe*) peak=51 ;;
  *H100*|*H200*) peak=67 ;;
  *) peak=0 ;;
esac
peak="${ASYNCPS_PEAK_TFLOPS:-$peak}"
optional="${ASYNCPS_GPU_OPTIONAL:-0}"
if [ "$gpu" = 1 ]; then
  record gpu ok "$gpu_name, fp32 peak ${peak} TFLOP/s"
  optional=0  # a listed GPU must work
elif [ "$optional" = 1 ]; then
  record gpu skipped "no GPU listed; ASYNCPS_GPU_OPTIONAL=1: CPU only"
else
  record gpu FAILED "no GPU listed by nvidia-smi (ASYNCPS_GPU_OPTIONAL=1 runs on the CPU)"
fi
if [ "$optional" = 1 ]; then
  require=0; bench_device=auto; worker_device=cpu
else
  require=1; bench_device=both; worker_device=cuda
fi

# --- startup -----------------------------------------------------------------
# The binaries start without a GPU too; each command has its own timeout.
startup() {
  local rc=0 port_file="$WORK/startup.port" pid
  timeout -k 2 10 "${RUN[@]}" "$WORK/bin/ps_worker" --version || rc=1
  local help
  help=$(timeout -k 2 10 "${RUN[@]}" "$WORK/bin/ps_worker" --helpfull 2>&1)
  case "$help" in
    *"--device ("*) ;;
    *) echo "ps_worker --helpfull lists no --device"; rc=1 ;;
  esac
  "${RUN[@]}" "$WORK/bin/ps_server" --host=127.0.0.1 --port=0 \
    --port_file="$port_file" >"$WORK/startup-server.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do [ -s "$port_file" ] && break; sleep 0.1; done
  if [ -s "$port_file" ]; then
    echo "ps_server serves on port $(cat "$port_file")"
    kill -TERM "$pid"
    wait "$pid" || { echo "ps_server exited with $? on SIGTERM"; rc=1; }
  else
    echo "ps_server wrote no port file in 10 s:"
    cat "$WORK/startup-server.log"
    kill -KILL "$pid" 2>/dev/null
    rc=1
  fi
  timeout -k 2 20 "${RUN[@]}" "$WORK/bin/backend_bench" --device=cpu \
    --models=784-10 --batches=8 --gemm_sizes=64 --iters=2 --warmup=1 \
    --max_seconds=1 || rc=1
  return $rc
}
if msg=$(startup 2>&1); then
  record startup ok "ps_server serves, ps_worker --version/--helpfull, backend_bench --device=cpu"
else
  record startup FAILED "$(echo "$msg" | tail -n 3 | tr '\n' ' ')"
fi
{ echo "== startup"; echo "$msg"; } >>"$ENV_TXT"
[ "$smoke" = 1 ] && finish

# --- parity ------------------------------------------------------------------
timeout -k 5 "$(limit 60)" env ASYNCPS_REQUIRE_CUDA="$require" "${RUN[@]}" \
  "$WORK/bin/cuda_parity_test" --durations yes >"$out/parity.txt" 2>&1
rc=$?
cases=$(grep -o 'All tests passed.*' "$out/parity.txt" | tail -n1)
if [ $rc -eq 0 ] && grep -q '^ASYNCPS_SKIPPED:' "$out/parity.txt"; then
  record parity skipped "$(grep -m1 '^ASYNCPS_SKIPPED:' "$out/parity.txt" | cut -c18-)"
elif [ $rc -eq 0 ]; then
  record parity ok "$cases"
else
  record parity FAILED "rc=$rc; $(grep -m1 -E 'FAILED|failed' "$out/parity.txt")"
fi

# --- bench -------------------------------------------------------------------
timeout -k 5 "$(limit 100)" "${RUN[@]}" "$WORK/bin/backend_bench" \
  --device="$bench_device" --models=784-256-128-10,784-4096-4096-10 \
  --batches=64,1024 --gemm_sizes=1024,2048,4096,8192 --iters=40 --warmup=2 \
  --max_seconds=2.5 --peak_tflops="$peak" --csv="$out/bench.csv" \
  >"$out/bench.txt" 2>&1
rc=$?
if [ $rc -eq 0 ]; then record bench ok; else record bench FAILED "rc=$rc"; fi
# One line per (model, batch): examples/s per backend and the ratio; then
# GEMM TFLOP/s per size.
awk '
  /^mlp .* backend=/ {
    split($0, f, " "); key = f[2] " " f[3]
    for (i in f) if (f[i] ~ /^backend=/) b = substr(f[i], 9)
    for (i in f) if (f[i] ~ /^examples_per_s=/) r[key] = r[key] " " b " " substr(f[i], 16) "/s"
  }
  /^mlp .* ratio_cuda_over_cpu=/ { split($0, f, " "); print "  " f[2] " " f[3] ":" r[f[2] " " f[3]] ", " f[4] }
  /^gemm .* (tflops=|skipped)/ { print "  " $0 }
' "$out/bench.txt" | tee -a "$SUMMARY"
# The targets (reported, not asserted).
awk -v peak="$peak" '
  /^mlp model=784-4096-4096-10 batch=1024 ratio_cuda_over_cpu=/ {
    ratio = substr($4, 21)
  }
  /^gemm .* backend=cuda.* tflops=/ {
    for (i = 1; i <= NF; i++) if ($i ~ /^tflops=/) t = substr($i, 8) + 0
    if (t > best) { best = t; n = $2 }
  }
  END {
    printf "  target: 784-4096-4096-10 batch 1024 cuda/cpu %s (expected >= 10 on an H200)\n", ratio == "" ? "n/a" : ratio
    if (best > 0 && peak > 0)
      printf "  target: best CUDA GEMM %.1f TFLOP/s (%s) = %.2f of the %s TFLOP/s fp32 peak\n", best, n, best / peak, peak
    else
      printf "  target: CUDA GEMM efficiency n/a (no CUDA result or unknown peak)\n"
  }
' "$out/bench.txt" | tee -a "$SUMMARY"

# --- cluster -----------------------------------------------------------------
# cluster NAME WORKERS SECONDS: 2 shards + WORKERS workers on loopback.
cluster() {
  local name="$1" workers="$2" seconds="$3" dir="$WORK/$1" s w pid rc=0
  local shard_pids=() worker_pids=() servers="" train=()
  mkdir -p "$dir"
  if [ "$worker_device" = cuda ]; then train=(--epochs=2)
  else train=(--steps=150); fi
  for s in 0 1; do
    "${RUN[@]}" "$WORK/bin/ps_server" --host=127.0.0.1 --port=0 \
      --port_file="$dir/port$s" --shard_index=$s --num_shards=2 \
      >"$dir/shard$s.log" 2>&1 &
    shard_pids+=($!)
    PIDS+=($!)
  done
  for s in 0 1; do
    for _ in $(seq 150); do [ -s "$dir/port$s" ] && break; sleep 0.1; done
    [ -s "$dir/port$s" ] || { echo "shard $s wrote no port file" >>"$dir/errors"; rc=1; }
    servers="${servers:+$servers,}127.0.0.1:$(cat "$dir/port$s" 2>/dev/null)"
  done
  if [ $rc -eq 0 ]; then
    for ((w = 0; w < workers; w++)); do
      OPENBLAS_NUM_THREADS=$([ "$worker_device" = cpu ] && echo 1 || echo 4) \
        timeout -k 5 "$seconds" "${RUN[@]}" "$WORK/bin/ps_worker" \
        --servers="$servers" --worker_id=$w --num_workers="$workers" \
        --device="$worker_device" --data_dir="$DATA" "${train[@]}" \
        --log_every_steps=200 >"$dir/worker$w.log" 2>&1 &
      worker_pids+=($!)
      PIDS+=($!)
    done
    for ((w = 0; w < workers; w++)); do
      wait "${worker_pids[$w]}" ||
        { echo "worker $w exited with $?" >>"$dir/errors"; rc=1; }
    done
  fi
  for pid in "${shard_pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${shard_pids[@]}"; do
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  PIDS=()  # all reaped: their ids may be reused now
  {
    echo "===== $name: 2 shards + $workers $worker_device worker(s), ${train[*]}"
    cat "$dir/errors" 2>/dev/null
    for f in "$dir"/worker*.log; do echo "--- $(basename "$f")"; cat "$f"; done
    for f in "$dir"/shard*.log; do
      echo "--- $(basename "$f") (last 15 lines)"
      tail -n 15 "$f"
    done
  } >>"$out/cluster.txt"
  local acc examples wall rate
  acc=$(sed -n 's/^final test accuracy: //p' "$dir/worker0.log" | tail -n1)
  # Aggregate examples/s: all workers' examples over the slowest one's time.
  read -r examples wall < <(cat "$dir"/worker*.log |
    sed -n 's/.* done: steps [0-9]*\.\.[0-9]* (\([0-9]*\) examples) in \([0-9.]*\) s,.*/\1 \2/p' |
    awk '{e += $1; if ($2 > w) w = $2} END {printf "%d %.1f\n", e, w}')
  rate=$(awk -v e="$examples" -v w="$wall" \
    'BEGIN { printf "%.0f", (w > 0) ? e / w : 0 }')
  local detail="accuracy ${acc:-none}, $examples examples in $wall s"
  detail="$detail = $rate examples/s, ${train[*]}"
  if [ $rc -eq 0 ] && [ -n "$acc" ]; then
    record "$name" ok "$detail"
  else
    record "$name" FAILED "$detail; $(cat "$dir/errors" 2>/dev/null | tr '\n' ' ')"
  fi
}
cluster cluster-1 1 "$(limit 55)"
cluster cluster-4 4 "$(limit 60)"

finish
