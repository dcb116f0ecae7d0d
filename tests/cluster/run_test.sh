#!/usr/bin/env bash
# Runs tests/cluster/emulated_cluster_test.py under Debian's interpreter
# (the repository has no Bazel Python toolchain), from the test's runfiles.
set -euo pipefail
runfiles="${TEST_SRCDIR:?run through bazel test}/asyncps"
export PYTHONDONTWRITEBYTECODE=1
export PYTHONUNBUFFERED=1
exec /usr/bin/python3 "$runfiles/tests/cluster/emulated_cluster_test.py"
