#!/usr/bin/env bash
# Measures how asyncps recovers from faults, with real processes on loopback
# (a study, not a test: it prints figures, it asserts nothing):
#   1. shard restart: 2 shards (checkpoint every second) + 2 workers train
#      3 epochs; shard 1 is killed with SIGKILL mid-run and started again
#      2 s later on the same port. Reports the time from the restarted
#      shard's "serving" line to the first answer each worker got from it,
#      the longest gap between a worker's progress lines, and the final
#      accuracy next to an undisturbed run of the same length.
#   2. SSP peer death: 1 shard (SSP, slack 1, lease 2 s, wait timeout 600 s),
#      2 workers; worker 1 is frozen (SIGSTOP), worker 0 runs into the slack
#      and is killed with SIGKILL while its pull waits; worker 1 resumes.
#      Reports how long worker 1's next steps waited for the dead worker,
#      next to the lease.
#
# Usage: tests/faults/recovery_study.sh OUTDIR   (needs the binaries built:
# bazel build //server:ps_server //worker:ps_worker //tools:psctl)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: $0 OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
bin=${ASYNCPS_BIN:-$(bazel info bazel-bin 2>/dev/null)}
server=$bin/server/ps_server
worker=$bin/worker/ps_worker
psctl=$bin/tools/psctl
data=/usr/share/datasets/fashion-mnist

pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

now() { date +%s.%N; }
# ms between two "YYYY-mm-dd HH:MM:SS.mmm" stamps of a log line.
stamp_s() { date -d "$1" +%s.%N; }

start_shard() {  # index num_shards port extra... ; prints nothing
  local i=$1 n=$2 port=$3
  shift 3
  rm -f "$out/shard$i.port"
  "$server" --shard_index="$i" --num_shards="$n" --port="$port" \
    --port_file="$out/shard$i.port" "$@" >>"$out/shard$i.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do [ -s "$out/shard$i.port" ] && return 0; sleep 0.1; done
  echo "shard $i did not start" >&2
  exit 1
}

train() {  # name servers ; starts 2 workers, their pids in wp
  local name=$1 servers=$2 w
  wp=()
  for w in 0 1; do
    "$worker" --servers="$servers" --worker_id=$w --num_workers=2 --epochs=3 \
      --seed=7 --log_every_steps=20 --data_dir="$data" \
      >"$out/$name.worker$w.log" 2>&1 &
    wp+=($!)
  done
  pids+=("${wp[@]}")
}

echo "== 1. shard restart"
rm -f "$out"/*.log
start_shard 0 2 0
start_shard 1 2 0
servers="127.0.0.1:$(cat "$out/shard0.port"),127.0.0.1:$(cat "$out/shard1.port")"
train undisturbed "$servers"
wait "${wp[@]}"
acc_undisturbed=$(sed -n 's/^final test accuracy: //p' "$out/undisturbed.worker0.log")
cleanup
pids=()

ckpt=$out/ckpt
rm -rf "$ckpt"
start_shard 0 2 0 --checkpoint_dir="$ckpt" --checkpoint_every_s=1
start_shard 1 2 0 --checkpoint_dir="$ckpt" --checkpoint_every_s=1
shard1=${pids[1]}
port1=$(cat "$out/shard1.port")
servers="127.0.0.1:$(cat "$out/shard0.port"),127.0.0.1:$port1"
train disturbed "$servers"
until grep -q 'epoch 2/3' "$out/disturbed.worker0.log"; do sleep 0.05; done
kill -9 "$shard1"
killed=$(now)
sleep 2
start_shard 1 2 "$port1" --checkpoint_dir="$ckpt" --checkpoint_every_s=1
serving=$(now)
wait "${wp[@]}"
acc_disturbed=$(sed -n 's/^final test accuracy: //p' "$out/disturbed.worker0.log")
for w in 0 1; do
  log=$out/disturbed.worker$w.log
  # The first call answered by shard 1 after it failed.
  line=$(grep -m1 "on shard 1 .* answered after" "$log" || true)
  if [ -n "$line" ]; then
    t=$(stamp_s "$(cut -c1-23 <<<"$line")")
    echo "worker $w: first answer from the restarted shard $(awk -v a="$serving" -v b="$t" 'BEGIN { printf "%.0f", (b - a) * 1000 }') ms after it served again ($(sed -E 's/.*answered after ([0-9]+) attempts.*/\1/' <<<"$line") attempts)"
  fi
  # Longest gap between consecutive progress lines (20 steps each).
  gap=$(grep -E '^[0-9-]+ [0-9:]+ worker [0-9] epoch' "$log" | cut -c1-19 |
    while read -r d; do date -d "$d" +%s; done |
    awk 'NR > 1 { g = $1 - p; if (g > m) m = g } { p = $1 } END { print m + 0 }')
  echo "worker $w: longest gap between progress lines ${gap} s (the shard was down $(awk -v a="$killed" -v b="$serving" 'BEGIN { printf "%.1f", b - a }') s)"
done
echo "final test accuracy: undisturbed $acc_undisturbed, with a shard restart $acc_disturbed"
"$psctl" status --servers="$servers" >"$out/status_after_restart.txt" 2>&1 || true
cleanup
pids=()

echo "== 2. SSP peer death"
start_shard 0 1 0 --consistency=ssp --ssp_slack=1 --worker_lease_ms=2000 \
  --pull_wait_timeout_ms=600000
servers="127.0.0.1:$(cat "$out/shard0.port")"
"$worker" --servers="$servers" --worker_id=0 --num_workers=2 --hidden=32 \
  --steps=100000 --evaluate=false --log_every_steps=10 --data_dir="$data" \
  >"$out/ssp.worker0.log" 2>&1 &
fast=$!
"$worker" --servers="$servers" --worker_id=1 --num_workers=2 --hidden=32 \
  --steps=400 --evaluate=false --log_every_steps=10 --data_dir="$data" \
  >"$out/ssp.worker1.log" 2>&1 &
slow=$!
pids+=("$fast" "$slow")
until grep -q 'step 100/' "$out/ssp.worker1.log"; do sleep 0.05; done
kill -STOP "$slow"
# Until worker 0's pull waits for the frozen worker 1 (seen twice, 0.2 s
# apart: a push of worker 1 still in flight may release one wait).
waiting() {
  "$psctl" status --servers="$servers" -o json 2>/dev/null |
    grep -q '"worker_id":0[^}]*"waiting_pulls":[1-9]'
}
for _ in $(seq 100); do
  waiting && sleep 0.2 && waiting && break
  sleep 0.05
done
kill -9 "$fast"
killed=$(now)
kill -CONT "$slow"
wait "$slow"
resumed=$(now)
# Worker 1's steps after the kill waited for the dead worker until its
# lease ran out (it stopped waiting for it when evicted).
evicted=$(grep -m1 'worker 0 evicted' "$out/shard0.log" | cut -c1-23)
echo "worker 0 killed while its pull waited; evicted $(awk -v a="$killed" -v b="$(stamp_s "$evicted")" 'BEGIN { printf "%.0f", (b - a) * 1000 }') ms later (lease 2000 ms, pull wait timeout 600000 ms)"
"$psctl" status --servers="$servers" -o json >"$out/ssp_status.json" 2>&1 || true
echo "worker 1 finished $(awk -v a="$killed" -v b="$resumed" 'BEGIN { printf "%.1f", b - a }') s after the kill; cancelled pulls: $(grep -o '"cancelled_pulls": *[0-9]*' "$out/ssp_status.json" | head -n1 | grep -o '[0-9]*$'), wait timeouts: $(grep -o '"pull_wait_timeouts": *[0-9]*' "$out/ssp_status.json" | head -n1 | grep -o '[0-9]*$')"
