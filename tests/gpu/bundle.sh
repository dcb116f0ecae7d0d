#!/usr/bin/env bash
# Makes the GPU bundle: everything tests/gpu/run_bundle.sh needs to run the
# GPU check on a machine with an NVIDIA GPU, the driver and CUDA 13, but
# without Bazel, Debian -dev libraries or network.
#
#   tests/gpu/bundle.sh [--no-build] [--verify] [DIR]     (DIR: gpu-bundle)
#
# Builds the CUDA configuration (bazel build --config=cuda) of ps_server,
# ps_worker, cuda_parity_test and backend_bench and writes DIR/:
#   asyncps-gpu.tar.xz  bin/ (the four binaries, stripped), lib/ (every shared
#                       library they load except glibc and CUDA's: gRPC,
#                       protobuf, Abseil, spdlog/fmt, OpenBLAS, OpenSSL, re2,
#                       c-ares, zlib, libstdc++, libgfortran, ..., stripped),
#                       glibc/ (this machine's glibc and loader, used only
#                       where the GPU machine's glibc is older than
#                       GLIBC_REQUIRED), GLIBC_REQUIRED, SHA256SUMS
#   fashion-mnist/      the full Fashion-MNIST files (Debian's
#                       dataset-fashion-mnist; installed if missing)
#   run_bundle.sh       a copy of tests/gpu/run_bundle.sh
#   MANIFEST.txt        commit, build machine, glibc needed, sizes, files
# and prints the bundle's size; fails if the bundle plus the repository's
# files exceed 64 MiB (what travels to a borrowed GPU machine). The CUDA
# libraries (libcudart, libcublas, libcublasLt 13) come from the GPU
# machine. --verify then runs tests/gpu/verify_bundle.sh on DIR.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo="$(pwd)"

dir=gpu-bundle
build=1
verify=0
while [ $# -gt 0 ]; do
  case "$1" in
    --no-build) build=0; shift ;;
    --verify) verify=1; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    -*) echo "bundle.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) dir="$1"; shift ;;
  esac
done
if [ -e "$dir" ] && [ -n "$(ls -A "$dir")" ] && [ ! -f "$dir/MANIFEST.txt" ]; then
  echo "bundle.sh: $dir exists and is not a bundle; not replacing it" >&2
  exit 2
fi

data_src=/usr/share/datasets/fashion-mnist
if [ ! -f "$data_src/train-images-idx3-ubyte.gz" ]; then
  echo "== installing dataset-fashion-mnist"
  apt-get install -y dataset-fashion-mnist >/dev/null
fi

targets=(//server:ps_server //worker:ps_worker //tests/kernels:cuda_parity_test
  //tests/bench:backend_bench)
if [ $build -eq 1 ]; then
  echo "== bazel build --config=cuda ${targets[*]}"
  bazel build --config=cuda "${targets[@]}"
fi
bin="$(bazel info --config=cuda bazel-bin 2>/dev/null)"
binaries=("$bin/server/ps_server" "$bin/worker/ps_worker"
  "$bin/tests/kernels/cuda_parity_test" "$bin/tests/bench/backend_bench")

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$stage/glibc"
cp "${binaries[@]}" "$stage/bin/"

# glibc's libraries stay the GPU machine's (copies go to glibc/ for machines
# whose glibc is too old); CUDA's come from its CUDA install.
glibc_libs=" libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1 libresolv.so.2 libutil.so.1 ld-linux-x86-64.so.2 "
for b in "${binaries[@]}"; do
  if ldd "$b" | grep -q 'not found'; then
    echo "bundle.sh: $b has unresolved libraries:" >&2
    ldd "$b" | grep 'not found' >&2
    exit 1
  fi
  ldd "$b" | sed -n 's/^\s*\(\S*\) => \(\/\S*\) .*/\1 \2/p'
done | sort -u | while read -r name path; do
  case "$glibc_libs" in *" $name "*) cp -L "$path" "$stage/glibc/$name"; continue ;; esac
  case "$path" in /usr/local/cuda*) continue ;; esac
  case "$name" in libcudart.so.*|libcublas.so.*|libcublasLt.so.*) continue ;; esac
  cp -L "$path" "$stage/lib/$name"
done
cp -L /lib64/ld-linux-x86-64.so.2 "$stage/glibc/"
chmod -R u+w "$stage"
strip "$stage"/bin/*
strip --strip-unneeded "$stage"/lib/*

# The newest glibc symbol version anything bundled (outside glibc) needs.
objdump -T "$stage"/bin/* "$stage"/lib/* 2>/dev/null |
  grep -oE '\bGLIBC_[0-9]+\.[0-9]+(\.[0-9]+)?' | sed 's/GLIBC_//' |
  sort -uV | tail -n1 >"$stage/GLIBC_REQUIRED"
(cd "$stage" && find . -type f ! -name SHA256SUMS | sort | xargs sha256sum >SHA256SUMS)

rm -rf "$dir"
mkdir -p "$dir/fashion-mnist"
echo "== compressing ($(du -sh "$stage" | cut -f1) of binaries and libraries)"
tar -C "$stage" -cf - . | xz -T0 -6 >"$dir/asyncps-gpu.tar.xz"
cp "$data_src"/*-ubyte.gz "$dir/fashion-mnist/"
cp tests/gpu/run_bundle.sh "$dir/"
{
  echo "asyncps GPU bundle (tests/gpu/bundle.sh); run: run_bundle.sh OUTDIR"
  echo "commit: $(git describe --always --dirty 2>/dev/null || echo unknown)"
  echo "made: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), $(getconf GNU_LIBC_VERSION)"
  echo "needs: glibc >= $(cat "$stage/GLIBC_REQUIRED") (else the bundled one), NVIDIA driver for CUDA 13, libcudart/libcublas/libcublasLt 13"
  echo "unpacked: $(du -sb "$stage" | cut -f1) bytes"
  echo "--- asyncps-gpu.tar.xz"
  (cd "$stage" && find . -type f -printf '  %p %s\n' | sort)
  echo "--- data"
  (cd "$dir" && find fashion-mnist -type f -printf '  %p %s\n' | sort)
} >"$dir/MANIFEST.txt"

bundle_bytes=$(du -sb "$dir" | cut -f1)
tree_bytes=$( { git ls-files -z; git ls-files -z -o --exclude-standard; } |
  xargs -0 -r du -cb 2>/dev/null | tail -n1 | cut -f1)
mib() { echo "$(( ($1 + 1048575) / 1048576 )) MiB"; }
echo "bundle: $dir, $bundle_bytes bytes ($(mib "$bundle_bytes")):"
du -b "$dir"/asyncps-gpu.tar.xz "$dir"/fashion-mnist | sed 's/^/  /'
echo "with the repository's files: $((bundle_bytes + tree_bytes)) bytes" \
  "($(mib $((bundle_bytes + tree_bytes))) of the 64 MiB that may travel)"
if [ $((bundle_bytes + tree_bytes)) -gt $((64 * 1048576)) ]; then
  echo "bundle.sh: too large to travel with the working tree" >&2
  exit 1
fi
if [ $verify -eq 1 ]; then
  exec "$repo/tests/gpu/verify_bundle.sh" "$dir"
fi
