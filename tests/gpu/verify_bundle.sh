#!/usr/bin/env bash
# Verifies a bundle made by tests/gpu/bundle.sh on this machine (as root, no
# GPU needed), so that a missing library shows up here and not on the GPU
# machine. Checks, each expected to end as stated:
#   host-smoke       run_bundle.sh --smoke here, unpacking with python3:
#                    although this machine has every Debian library, each
#                    bundled binary must resolve its libraries from the
#                    bundle, glibc or /usr/local/cuda (ok)
#   host-missing-lib the bundle without lib/libgrpc.so.29: the libraries
#                    step must fail and name it (a check that can fail)
#   bookworm-full    a minimal Debian 12 root file system (mmdebstrap
#                    --variant=minbase, plus xz-utils; no -dev libraries, no
#                    Bazel, no Python, no GPU) with only the CUDA 13
#                    libraries copied in: run_bundle.sh, every step, with
#                    ASYNCPS_GPU_OPTIONAL=1 in an empty environment (ok)
#   bullseye-full    a minimal Debian 11 root (glibc 2.31, older than the
#                    bundle needs): run_bundle.sh must switch to the
#                    bundle's own glibc and pass every step as above (ok)
#   bullseye-native  the same with ASYNCPS_BUNDLE_GLIBC=0 and --smoke: the
#                    libraries step must fail (the machine's glibc is too
#                    old)
# The root file systems are made once and kept in
# ${XDG_CACHE_HOME:-~/.cache}/asyncps-gpu-verify/ (mmdebstrap, installed if
# missing; needs Debian's package archive). Results of each check in
# OUTDIR/<check>/; ends with "N passed, N failed, N skipped".
#
# Usage: tests/gpu/verify_bundle.sh [--out OUTDIR] [BUNDLE_DIR]
#        (BUNDLE_DIR: gpu-bundle; OUTDIR: a new temporary folder)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2

bundle=gpu-bundle
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="${2:-}"; shift 2 || exit 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    -*) echo "verify_bundle.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) bundle="$1"; shift ;;
  esac
done
if [ ! -f "$bundle/asyncps-gpu.tar.xz" ] || [ ! -f "$bundle/run_bundle.sh" ]; then
  echo "verify_bundle.sh: $bundle is not a bundle (make one with tests/gpu/bundle.sh)" >&2
  exit 2
fi
if [ "$(id -u)" != 0 ]; then
  echo "verify_bundle.sh: needs root (mmdebstrap, chroot, mounts)" >&2
  exit 2
fi
bundle="$(cd "$bundle" && pwd)"
[ -n "$out" ] || out="$(mktemp -d "${TMPDIR:-/tmp}/asyncps-verify.XXXXXX")"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/asyncps-gpu-verify"
mkdir -p "$cache"
work="$(mktemp -d "${TMPDIR:-/tmp}/asyncps-verify-work.XXXXXX")"
trap 'rm -rf "$work"' EXIT
echo "results in $out"

passed=0
failed=0
# check NAME EXPECT RC SUMMARY_FILE [MUST_CONTAIN]: EXPECT is ok (RC 0) or
# fail (RC != 0); MUST_CONTAIN, when given, must appear in the summary.
check() {
  local name="$1" expect="$2" rc="$3" summary="$4" must="${5:-}" verdict=ok
  if [ "$expect" = ok ] && [ "$rc" != 0 ]; then verdict=FAILED; fi
  if [ "$expect" = fail ] && [ "$rc" = 0 ]; then verdict=FAILED; fi
  if [ -n "$must" ] && ! grep -qF -- "$must" "$summary" 2>/dev/null; then
    verdict=FAILED
  fi
  echo "$name: $verdict (run_bundle.sh exit $rc, expected $expect${must:+, with \"$must\"})"
  sed 's/^/    /' "$summary" 2>/dev/null | tail -n 14
  if [ $verdict = ok ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
}

# --- on this machine ---------------------------------------------------------
mkdir -p "$out/host-smoke"
ASYNCPS_GPU_OPTIONAL=1 ASYNCPS_UNPACK_WITH=python3 \
  "$bundle/run_bundle.sh" --smoke "$out/host-smoke" >/dev/null 2>&1
check host-smoke ok $? "$out/host-smoke/summary.txt"

# The same bundle less one library, re-packed (with fresh checksums).
mkdir -p "$work/unpacked" "$work/missing" "$out/host-missing-lib"
tar -xJf "$bundle/asyncps-gpu.tar.xz" -C "$work/unpacked"
rm "$work/unpacked/lib/libgrpc.so.29"
(cd "$work/unpacked" && find . -type f ! -name SHA256SUMS | sort |
  xargs sha256sum >SHA256SUMS)
tar -C "$work/unpacked" -cf - . | xz -0 -T0 >"$work/missing/asyncps-gpu.tar.xz"
cp "$bundle/run_bundle.sh" "$work/missing/"
ln -s "$bundle/fashion-mnist" "$work/missing/fashion-mnist"
rm -rf "$work/unpacked"
ASYNCPS_GPU_OPTIONAL=1 "$work/missing/run_bundle.sh" --smoke \
  "$out/host-missing-lib" >/dev/null 2>&1
check host-missing-lib fail $? "$out/host-missing-lib/summary.txt" \
  "libraries: FAILED"
grep -h 'PROBLEM:.*libgrpc.so.29' "$out/host-missing-lib/env.txt" | head -n 2 |
  sed 's/^/    /'

# --- in minimal root file systems --------------------------------------------
# rootfs SUITE: a fresh copy of the cached minimal SUITE root in $work.
rootfs() {
  local suite="$1" cached="$cache/$1-minbase" root="$work/root-$1"
  if [ ! -d "$cached" ]; then
    command -v mmdebstrap >/dev/null || apt-get install -y mmdebstrap >&2 ||
      return 1
    echo "== mmdebstrap $suite (once; cached in $cache)" >&2
    rm -rf "$cached.tmp"
    mmdebstrap --variant=minbase --include=xz-utils --format=directory \
      "$suite" "$cached.tmp" http://deb.debian.org/debian >&2 &&
      mv "$cached.tmp" "$cached" || return 1
  fi
  rm -rf "$root"
  cp -a "$cached" "$root" || return 1
  # The GPU machine's CUDA install: the three libraries the binaries link.
  mkdir -p "$root/usr/local/cuda/lib64"
  local f
  for f in /usr/local/cuda/lib64/libcudart.so.13* \
    /usr/local/cuda/lib64/libcublas.so.13* \
    /usr/local/cuda/lib64/libcublasLt.so.13*; do
    cp -al "$f" "$root/usr/local/cuda/lib64/" 2>/dev/null ||
      cp -a "$f" "$root/usr/local/cuda/lib64/" || return 1
  done
  cp -a "$bundle" "$root/bundle"
  echo "$root"
}

# in_root ROOT ENV... -- run_bundle.sh arguments: runs the bundle's
# run_bundle.sh inside ROOT (own mount and PID namespaces, /proc and /dev
# mounted there), in an environment holding only ENV and a PATH.
in_root() {
  local root="$1"
  shift
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  unshare --mount --pid --fork --kill-child sh -c '
    root="$1"; shift
    mount -t proc proc "$root/proc" && mount --rbind /dev "$root/dev" &&
      exec chroot "$root" "$@"' sh "$root" \
    env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root TMPDIR=/tmp "${envs[@]}" bash /bundle/run_bundle.sh "$@"
}

# run_in SUITE CHECK EXPECT MUST ENV... -- ARGS: one check in a fresh root.
run_in() {
  local suite="$1" name="$2" expect="$3" must="$4" root rc
  shift 4
  if ! root="$(rootfs "$suite")"; then
    echo "$name: FAILED (no $suite root file system)"
    failed=$((failed + 1))
    return
  fi
  in_root "$root" "$@" /out >"$root/run.log" 2>&1
  rc=$?
  mkdir -p "$out/$name"
  cp -a "$root/out/." "$out/$name/" 2>/dev/null
  cp "$root/run.log" "$out/$name/run.log"
  check "$name" "$expect" "$rc" "$out/$name/summary.txt" "$must"
  # The mounts lived in the check's own namespace; never delete through one.
  if grep -q " $root/" /proc/self/mounts; then
    echo "verify_bundle.sh: $root still has mounts; leaving it" >&2
  else
    rm -rf "$root"
  fi
}

run_in bookworm bookworm-full ok "0 failed" ASYNCPS_GPU_OPTIONAL=1 --
run_in bullseye bullseye-full ok "bundle's own glibc" ASYNCPS_GPU_OPTIONAL=1 --
run_in bullseye bullseye-native fail "libraries: FAILED" \
  ASYNCPS_GPU_OPTIONAL=1 ASYNCPS_BUNDLE_GLIBC=0 -- --smoke

echo "$passed passed, $failed failed, 0 skipped"
[ "$failed" -eq 0 ]
