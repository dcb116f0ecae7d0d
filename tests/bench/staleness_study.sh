#!/usr/bin/env bash
# The staleness convergence study: the Fashion-MNIST MLP on 2 shards and 4
# workers, worker 3 made a straggler (it sleeps 12 ms a step: about 3x slower
# than the others here), trained under four policies with the
# same seed and epoch budget:
#   asp          no waiting, no bound
#   ssp3         --consistency=ssp --ssp_slack=3
#   bsp          --consistency=bsp
#   asp_bound    --max_staleness=4 --staleness_lr=inverse
# Writes OUTDIR/study.csv (one row per evaluation), OUTDIR/summary.csv (one
# row per policy), OUTDIR/accuracy.png (test accuracy against wall time) and
# each run's logs under OUTDIR/<policy>/.
#
#   tests/bench/staleness_study.sh OUTDIR [--epochs N] [--straggler_ms MS]
#   tests/bench/staleness_study.sh OUTDIR --transient SPIKE_MS:PROB
#
# --transient replaces the persistent straggler by transient delays on every
# worker: each step sleeps SPIKE_MS with probability PROB (seeded per worker).
#
# A benchmark, not a test: numbers depend on the machine and its load.
set -euo pipefail
cd "$(dirname "$0")/../.."

out=${1:?usage: staleness_study.sh OUTDIR [--epochs N] [--straggler_ms MS] [--transient MS:PROB]}
shift
epochs=6
straggler_ms=12
transient=""
target=0.85
while [ $# -gt 0 ]; do
  case "$1" in
    --epochs) epochs="$2"; shift 2 ;;
    --straggler_ms) straggler_ms="$2"; shift 2 ;;
    --transient) transient="$2"; shift 2 ;;
    *) echo "staleness_study.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
delays=(--straggler "3:$straggler_ms")
delay_flags=""
title="worker 3 sleeps ${straggler_ms} ms/step"
if [ -n "$transient" ]; then
  if ! [[ "$transient" =~ ^([0-9]+):(0?\.[0-9]+|1)$ ]]; then
    echo "staleness_study.sh: --transient must be MS:PROB, got '$transient'" >&2; exit 2
  fi
  delays=()
  delay_flags="--delay_spike_ms=${BASH_REMATCH[1]} --delay_spike_prob=${BASH_REMATCH[2]}"
  title="every worker sleeps ${BASH_REMATCH[1]} ms on ${BASH_REMATCH[2]} of its steps"
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)

deploy/install_deps.sh
command -v gnuplot >/dev/null || {
  echo "installing gnuplot-nox for the plot"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gnuplot-nox >/dev/null
}
if ! bazel build //server:ps_server //worker:ps_worker >"$out/build.log" 2>&1; then
  grep -E 'ERROR|error:' "$out/build.log" | head -n 20
  exit 1
fi

declare -A flags=(
  [asp]=""
  [ssp3]="--consistency=ssp --ssp_slack=3"
  [bsp]="--consistency=bsp"
  [asp_bound]="--max_staleness=4 --staleness_lr=inverse"
)
policies=(asp ssp3 bsp asp_bound)

echo "policy,wall_s,step,epoch,test_accuracy,test_loss,refused,mean_staleness,max_staleness" >"$out/study.csv"
echo "policy,run_wall_s,time_to_${target}_s,final_accuracy,refused_slices,mean_staleness,max_staleness,straggler_examples_per_s,fast_examples_per_s" >"$out/summary.csv"

for p in "${policies[@]}"; do
  echo "== $p (${flags[$p]:-defaults})"
  rm -rf "${out:?}/$p"
  mkdir -p "$out/$p"
  timeout 600 deploy/local.sh --no-build --shards 2 --workers 4 --epochs "$epochs" \
    "${delays[@]}" --logdir "$out/$p" \
    --server-flags "${flags[$p]}" \
    --worker-flags "--eval_every_steps=40 --log_every_steps=1000 --eval_csv=$out/$p/eval.csv $delay_flags" \
    >"$out/$p/run.log" 2>&1 || { echo "run $p failed:"; tail -n 20 "$out/$p/run.log"; exit 1; }
  tail -n 2 "$out/$p/run.log"
  tail -n +2 "$out/$p/eval.csv" | sed "s/^/$p,/" >>"$out/study.csv"
  wall=$(sed -nE 's/.*: ([0-9.]+) s wall.*/\1/p' "$out/$p/run.log")
  final=$(sed -nE 's/^final test accuracy: ([0-9.]+)$/\1/p' "$out/$p/run.log" | tail -n 1)
  t85=$(awk -F, -v t="$target" 'NR > 1 && $4 >= t { print $1; exit }' "$out/$p/eval.csv")
  # Over all workers: refused slices summed, staleness mean of means, max of maxes.
  read -r refused smean smax < <(grep -h ' done: ' "$out/$p"/worker*.out |
    sed -E 's/.*refused slices ([0-9]+), staleness mean ([0-9.]+) max ([0-9]+).*/\1 \2 \3/' |
    awk '{r += $1; m += $2; if ($3 > x) x = $3; n++} END {printf "%d %.2f %d\n", r, m / n, x}')
  slow=$(sed -nE 's/.* done: .*[ (]([0-9.]+) examples\/s.*/\1/p' "$out/$p/worker3.out")
  fast=$(sed -nE 's/.* done: .*[ (]([0-9.]+) examples\/s.*/\1/p' "$out/$p/worker1.out")
  echo "$p,$wall,${t85:-never},$final,$refused,$smean,$smax,$slow,$fast" >>"$out/summary.csv"
done

gnuplot <<GNUPLOT
set terminal pngcairo size 960,600 font "sans,11" noenhanced
set output "$out/accuracy.png"
set title "Fashion-MNIST MLP, 2 shards x 4 workers, $title"
set xlabel "wall time (s)"
set ylabel "test accuracy"
set key bottom right
set grid
set datafile separator ","
set yrange [0.6:0.92]
plot for [p in "${policies[*]}"] "< grep '^".p.",' $out/study.csv" using 2:5 with linespoints title p
GNUPLOT

echo
column -s, -t "$out/summary.csv"
echo "wrote $out/study.csv, $out/summary.csv, $out/accuracy.png"
