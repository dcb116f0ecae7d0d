#!/usr/bin/env bash
# Files of one concept, short functions (see code_size.py): no non-test C++
# file of the library and program folders over 800 lines, no function over
# 100.
set -euo pipefail
root="${TEST_SRCDIR:?}/${TEST_WORKSPACE:-asyncps}"
cd "$root"
exec python3 tests/lint/code_size.py client common data kernels membership models python \
  server serving store tools worker
