#!/usr/bin/env bash
# Catch2 names that Catch2 can print (see test_names.py).
set -euo pipefail
root="${TEST_SRCDIR:?}/${TEST_WORKSPACE:-asyncps}"
cd "$root"
exec python3 tests/lint/test_names.py tests
