#!/usr/bin/env bash
# Runs clang's thread-safety analysis over the server, whose locks carry
# ABSL_GUARDED_BY / ABSL_EXCLUSIVE_LOCKS_REQUIRED annotations: any access to
# guarded state without its lock fails the test. Syntax-only: gcc builds the
# binaries; clang only checks.
set -euo pipefail
root="${TEST_SRCDIR:?}/${TEST_WORKSPACE:-asyncps}"
cd "$root"
clang=$(command -v clang++ || command -v clang++-14 || true)
if [ -z "$clang" ]; then
  echo "clang++ not found (deploy/install_deps.sh installs it)" >&2
  exit 1
fi
flags=(-std=c++17 -fsyntax-only -Wthread-safety -Wthread-safety-beta
  -Werror=thread-safety -Werror=thread-safety-beta -I.
  -DSPDLOG_SHARED_LIB -DSPDLOG_COMPILED_LIB -DSPDLOG_FMT_EXTERNAL
  -DCPPHTTPLIB_OPENSSL_SUPPORT -DCPPHTTPLIB_ZLIB_SUPPORT -DCPPHTTPLIB_BROTLI_SUPPORT)
failed=0
checked=0
for f in server/*.cc; do
  checked=$((checked + 1))
  if ! "$clang" "${flags[@]}" "$f"; then
    echo "FAILED: $f" >&2
    failed=$((failed + 1))
  fi
done
echo "thread-safety analysis: $checked files, $failed with findings"
[ "$checked" -gt 0 ] && [ "$failed" = 0 ]
