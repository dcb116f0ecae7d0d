#!/usr/bin/env bash
# Runs one pytest file (argument: its path in the workspace) under Debian's
# interpreter, with the asyncps package, ps_server and the examples taken
# from the test's Bazel runfiles. Exits with pytest's status.
set -euo pipefail
runfiles="${TEST_SRCDIR:?run through bazel test}/asyncps"
export PYTHONPATH="$runfiles/python/site:$runfiles/tests/python"
export ASYNCPS_PS_SERVER="$runfiles/server/ps_server"
export ASYNCPS_PS_SERVE="$runfiles/serving/ps_serve"
export ASYNCPS_EXAMPLES="$runfiles/python/examples"
export PYTHONDONTWRITEBYTECODE=1
# One torch thread per process: the CI machine has 2 cores.
export OMP_NUM_THREADS=1
cd "${TEST_TMPDIR:?}"
exec /usr/bin/python3 -m pytest -q -rs -p no:cacheprovider \
  --rootdir="$TEST_TMPDIR" --basetemp="$TEST_TMPDIR/pytest" \
  "$runfiles/$1"
