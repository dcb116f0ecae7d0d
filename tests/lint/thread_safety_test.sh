#!/usr/bin/env bash
# Runs clang's thread-safety analysis over every package whose locks carry
# ABSL_GUARDED_BY / ABSL_EXCLUSIVE_LOCKS_REQUIRED annotations: any access to
# guarded state without its lock fails the test. Syntax-only: gcc builds the
# binaries; clang only checks. Files that need the CUDA toolkit are skipped.
set -euo pipefail
root="${TEST_SRCDIR:?}/${TEST_WORKSPACE:-asyncps}"
cd "$root"
clang=$(command -v clang++ || command -v clang++-14 || true)
if [ -z "$clang" ]; then
  echo "clang++ not found (deploy/install_deps.sh installs it)" >&2
  exit 1
fi
flags=(-std=c++17 -fsyntax-only -Wthread-safety -Wthread-safety-beta
  -Werror=thread-safety -Werror=thread-safety-beta -I. -Ibazel-out/k8-fastbuild/bin
  -DSPDLOG_SHARED_LIB -DSPDLOG_COMPILED_LIB -DSPDLOG_FMT_EXTERNAL
  -DCPPHTTPLIB_OPENSSL_SUPPORT -DCPPHTTPLIB_ZLIB_SUPPORT -DCPPHTTPLIB_BROTLI_SUPPORT)
files=()
for f in common/*.cc store/*.cc server/*.cc serving/*.cc client/*.cc \
  data/*.cc membership/*.cc models/*.cc worker/*.cc tools/*.cc \
  tests/testing/*.cc \
  tests/staleness/*.cc tests/serving/*.cc; do
  [ -e "$f" ] && [[ "$f" != *cuda* ]] && files+=("$f")
done
# Two files at a time; each failure prints "FAILED: <file>".
export clang
printf '%s\n' "${files[@]}" |
  xargs -P 2 -I{} sh -c '"$clang" "$@" {} || echo "FAILED: {}"' sh "${flags[@]}" \
  >"${TEST_TMPDIR:-/tmp}/thread_safety.out" 2>&1 || true
cat "${TEST_TMPDIR:-/tmp}/thread_safety.out"
failed=$(grep -c '^FAILED: ' "${TEST_TMPDIR:-/tmp}/thread_safety.out" || true)
echo "thread-safety analysis: ${#files[@]} files, $failed with findings"
[ "${#files[@]}" -gt 0 ] && [ "$failed" = 0 ]
