#!/usr/bin/env bash
# Builds asyncps and runs the whole test suite.
#
#   tests/run.sh            # installs missing Debian packages, builds, tests
#
# Ends with one line "N passed, N failed, N skipped" (Bazel test targets) and
# exits non-zero when any test failed or the build broke. A target that
# passed but whose log (bazel-testlogs/<package>/<name>/test.log) has a line
# starting with "ASYNCPS_SKIPPED:" could not run here (e.g. needs a GPU) and
# counts as skipped, not passed; one whose log cannot be read counts as
# failed (whether it ran cannot be told). When nvcc is present the CUDA backend is
# compiled too (compile only: no test needs a GPU).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

summary() { echo "$1 passed, $2 failed, $3 skipped"; }

"$(dirname "$0")/../deploy/install_deps.sh" || { summary 0 1 0; exit 1; }

log=$(mktemp)
trap 'rm -f "$log"' EXIT

t0=$(date +%s)
echo "== build"
if ! bazel build //... >"$log" 2>&1; then
  grep -E 'ERROR|error:' "$log" | head -n 40
  summary 0 1 0
  exit 1
fi
echo "build: $(($(date +%s) - t0)) s"

cuda_failed=0
if [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null 2>&1; then
  echo "== build --config=cuda (compile only)"
  if ! bazel build --config=cuda //kernels:backend //tests/kernels:cuda_parity_test \
      >"$log" 2>&1; then
    grep -E 'ERROR|error' "$log" | head -n 40
    cuda_failed=1
  fi
  echo "cuda build: $(($(date +%s) - t0)) s since start"
fi

t1=$(date +%s)
echo "== test"
bazel test //... 2>&1 | tee "$log"
test_rc=${PIPESTATUS[0]}
echo "tests: $(($(date +%s) - t1)) s"

# Test logs of the default configuration (bazel-testlogs may point at
# another one).
testlogs=$(bazel info bazel-testlogs 2>/dev/null) || testlogs=bazel-testlogs
passed=0
skipped=0
unread=0
while read -r label; do
  path="${label#//}"
  path="${path/://}"
  if [ ! -r "$testlogs/$path/test.log" ]; then
    # Whether it ran or skipped cannot be told: not counted as passed.
    echo "unread: $label: no test log at $testlogs/$path/test.log"
    unread=$((unread + 1))
  elif grep -q '^ASYNCPS_SKIPPED:' "$testlogs/$path/test.log"; then
    echo "skipped: $label: $(grep -m1 '^ASYNCPS_SKIPPED:' \
      "$testlogs/$path/test.log" | cut -c18-)"
    skipped=$((skipped + 1))
  else
    passed=$((passed + 1))
  fi
done < <(grep -oE '^//\S+\s+(\(cached\) )?PASSED' "$log" | awk '{print $1}')
failed=$(grep -cE '^//\S+\s+(\(cached\) )?(FAILED|TIMEOUT|NO STATUS|FLAKY|INCOMPLETE)' "$log")
failed=$((failed + unread))
failed=$((failed + cuda_failed))
if [ "$test_rc" != 0 ] && [ "$failed" = 0 ]; then failed=1; fi
if [ "${CI:-}" = "true" ]; then bazel shutdown >/dev/null 2>&1 || true; fi
summary "$passed" "$failed" "$skipped"
[ "$failed" = 0 ]
