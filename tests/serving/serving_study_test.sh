#!/usr/bin/env bash
# tests/bench/serving_study.sh on a tiny run with the binaries of this
# build: every file and figure it promises is there and sane (every policy
# and rate measured, answers accounted for, batching seen where it is on and
# not where it is off, the plot a PNG).
set -euo pipefail
runfiles=${TEST_SRCDIR:-$0.runfiles}/asyncps
out=${TEST_TMPDIR:-$(mktemp -d)}/study
fail() { echo "FAIL: $*" >&2; exit 1; }

log=$(ASYNCPS_BIN=$runfiles bash "$runfiles/tests/bench/serving_study.sh" "$out" --tiny \
  --slo_ms 50 --rounds 2 2>&1) ||
  { echo "$log"; fail "the study failed"; }
echo "$log"
grep -qE '^model: MLP 784-256-128-10, final test accuracy: 0\.[0-9]+$' <<<"$log" ||
  fail "no model line naming the default MLP"
rc=0
bash "$runfiles/tests/bench/serving_study.sh" "$out.bad" --hidden 256,x \
  >/dev/null 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "--hidden 256,x: want exit 2, got $rc"
rc=0
bash "$runfiles/tests/bench/serving_study.sh" "$out.bad" --slo_ms 0 >/dev/null 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "--slo_ms 0: want exit 2, got $rc"

policies="none t50 t200 t1000 t5000 auto auto_slo"
[ "$(wc -l <"$out/summary.csv")" = 8 ] || fail "summary.csv: want 7 policies"
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

[ "$(wc -l <"$out/study.csv")" = 57 ] || fail "study.csv: want 7 x 8 rows"
# Two rounds of every point; study.csv holds, per point, the round with the
# lower mean latency (the median of two).
[ "$(wc -l <"$out/rounds.csv")" = 113 ] || fail "rounds.csv: want 2 x 7 x 8 rows"
tail -n +2 "$out/study.csv" | while IFS=, read -r p f rest; do
  mean=$(cut -d, -f7 <<<"$rest")
  low=$(awk -F, -v p="$p" -v f="$f" '$2 == p && $3 == f { print $10 }' "$out/rounds.csv" |
    sort -g | head -n 1)
  [ "$mean" = "$low" ] || fail "study.csv $p at $f: mean $mean, rounds' lower $low"
  grep -qF ",$p,$f,$rest" "$out/rounds.csv" || fail "study.csv row $p,$f is no round's"
done
awk -F, 'NR > 1 {
  # sent = ok + refused + failed; nothing failed; quantiles ordered.
  if ($5 != $6 + $7 + $8 || $8 != 0) exit 1
  if ($6 > 0 && !($9 > 0 && $11 >= $10 && $10 > 0 && $4 > 0)) exit 1
  if ($2 <= 0.4 && $6 == 0) exit 1
}' "$out/study.csv" || fail "study.csv has an insane row"

[ "$(wc -l <"$out/auto_vs_fixed.csv")" = 9 ] || fail "auto_vs_fixed.csv: want 8 rates"
awk -F, 'NR > 1 && !($4 > 0) { exit 1 }' "$out/auto_vs_fixed.csv" ||
  fail "auto_vs_fixed.csv lacks auto's latency"
# The rounds' spread at each rate: the median over the policies of their
# max / min round, recomputed here from rounds.csv.
tail -n +2 "$out/auto_vs_fixed.csv" | while IFS=, read -r f _ _ _ _ _ spread; do
  want=$(awk -F, -v f="$f" 'NR > 1 && $3 == f && $10 > 0 {
      k = $2; if (!(k in lo) || $10 < lo[k]) lo[k] = $10; if ($10 > hi[k]) hi[k] = $10 }
    END { for (k in lo) printf "%.3f\n", hi[k] / lo[k] }' "$out/rounds.csv" |
    sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
  [ "$spread" = "$want" ] || fail "auto_vs_fixed.csv at $f: spread $spread, rounds give $want"
  awk -v s="$spread" 'BEGIN { exit !(s >= 1) }' || fail "spread $spread below 1"
done
[ "$(grep -cE '% of saturation: best .*; rounds apart [0-9.]+x$' <<<"$log")" = 8 ] ||
  fail "want 8 auto lines"
grep -qE '^fixed waits within 10% of the best at every rate: ' <<<"$log" ||
  fail "no line on the fixed waits within 10% everywhere"
grep -qE '^auto within 10% of the best fixed wait at every rate: [0-9] of [1-8]$' <<<"$log" ||
  fail "no count of the rates where auto is within 10%"

# The objective's check: rates up to 80% (5), each p99 against 50 ms.
[ "$(wc -l <"$out/slo.csv")" = 6 ] || fail "slo.csv: want 5 rates"
awk -F, 'NR > 1 && !($2 > 0 && $3 == 50 && ($4 == "yes" || $4 == "no")) { exit 1 }' \
  "$out/slo.csv" || fail "slo.csv has an insane row: $(cat "$out/slo.csv")"
[ "$(grep -cE '% of saturation: p99 +[0-9.]+ ms \((within|OVER)\)$' <<<"$log")" = 5 ] ||
  fail "want 5 lines of auto_slo's p99"

if command -v gnuplot >/dev/null; then
  [ "$(head -c 8 "$out/latency.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] ||
    fail "latency.png is not a PNG"
  [ "$(stat -c %s "$out/latency.png")" -gt 10000 ] || fail "latency.png is empty"
fi
echo "serving study outputs OK"
