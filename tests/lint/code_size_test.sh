#!/usr/bin/env bash
# Files of one concept, short functions (see code_size.py): no non-test C++
# file of server/, store/, serving/, tools/, common/ or kernels/ over 800
# lines, no function over 100.
set -euo pipefail
root="${TEST_SRCDIR:?}/${TEST_WORKSPACE:-asyncps}"
cd "$root"
exec python3 tests/lint/code_size.py server store serving tools common kernels
