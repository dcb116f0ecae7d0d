#!/usr/bin/env bash
# tests/bench/serving_study.sh on a tiny run with the binaries of this
# build: every file and figure it promises is there and sane (every policy
# and rate measured, answers accounted for, batching seen where it is on and
# not where it is off, the plot a PNG).
set -euo pipefail
runfiles=${TEST_SRCDIR:-$0.runfiles}/asyncps
out=${TEST_TMPDIR:-$(mktemp -d)}/study
fail() { echo "FAIL: $*" >&2; exit 1; }

log=$(ASYNCPS_BIN=$runfiles bash "$runfiles/tests/bench/serving_study.sh" "$out" --tiny 2>&1) ||
  { echo "$log"; fail "the study failed"; }
echo "$log"
grep -qE '^model: MLP 784-256-128-10, final test accuracy: 0\.[0-9]+$' <<<"$log" ||
  fail "no model line naming the default MLP"
rc=0
bash "$runfiles/tests/bench/serving_study.sh" "$out.bad" --hidden 256,x \
  >/dev/null 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "--hidden 256,x: want exit 2, got $rc"

policies="none t50 t200 t1000 t5000 auto"
[ "$(wc -l <"$out/summary.csv")" = 7 ] || fail "summary.csv: want 6 policies"
for p in $policies; do
  row=$(grep "^$p," "$out/summary.csv") || fail "summary.csv: no $p"
  awk -F, '{ exit !($2 > 0 && $3 >= 1) }' <<<"$row" || fail "summary: $row"
  grep -qE "^  $p +[0-9]+ +[0-9.]+ rows +[0-9.]+x no batching$" <<<"$log" ||
    fail "no saturation line for $p"
done
# Alone, every batch is one row; under overload, batching policies batch.
awk -F, '$1 == "none" { exit !($3 == 1) }' "$out/summary.csv" ||
  fail "none batched: $(grep ^none, "$out/summary.csv")"
awk -F, 'NR > 1 && $1 != "none" && $3 <= 1.5 { exit 1 }' "$out/summary.csv" ||
  fail "a batching policy did not batch under overload: $(cat "$out/summary.csv")"

[ "$(wc -l <"$out/study.csv")" = 49 ] || fail "study.csv: want 6 x 8 rows"
awk -F, 'NR > 1 {
  # sent = ok + refused + failed; nothing failed; quantiles ordered.
  if ($5 != $6 + $7 + $8 || $8 != 0) exit 1
  if ($6 > 0 && !($9 > 0 && $11 >= $10 && $10 > 0 && $4 > 0)) exit 1
  if ($2 <= 0.4 && $6 == 0) exit 1
}' "$out/study.csv" || fail "study.csv has an insane row"

[ "$(wc -l <"$out/auto_vs_fixed.csv")" = 9 ] || fail "auto_vs_fixed.csv: want 8 rates"
awk -F, 'NR > 1 && !($4 > 0) { exit 1 }' "$out/auto_vs_fixed.csv" ||
  fail "auto_vs_fixed.csv lacks auto's latency"
[ "$(grep -c '% of saturation: best' <<<"$log")" = 8 ] || fail "want 8 auto lines"

if command -v gnuplot >/dev/null; then
  [ "$(head -c 8 "$out/latency.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] ||
    fail "latency.png is not a PNG"
  [ "$(stat -c %s "$out/latency.png")" -gt 10000 ] || fail "latency.png is empty"
fi
echo "serving study outputs OK"
