# shellcheck shell=bash
# Shared by the local launchers (deploy/local.sh, deploy/local_pytorch.sh):
# start ps_server shards on loopback, track every process started, wait for
# the workers, stop everything on exit, Ctrl-C or the first failure.
# Source it, then call cluster_init before starting anything.
#
# Globals it sets and uses: launcher (name for messages), logdir, pids,
# name_of, worker_pids, servers, cluster_start.

# cluster_init NAME LOGDIR: logs go to LOGDIR (a fresh temporary folder when
# empty); installs the cleanup traps.
cluster_init() {
  launcher=$1
  logdir=$2
  [ -n "$logdir" ] || logdir=$(mktemp -d -t "asyncps-${launcher%.sh}.XXXXXX")
  mkdir -p "$logdir"
  declare -gA name_of=()
  pids=()
  worker_pids=()
  trap cluster_cleanup EXIT
  trap 'echo; echo "interrupted; stopping the cluster"; cluster_cleanup; exit 130' INT TERM
  cluster_start=$(date +%s%N)
}

# Stops every process still running: SIGTERM, SIGKILL after 5 s.
cluster_cleanup() {
  trap - EXIT INT TERM
  local alive=()
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive+=("$p"); done
  if [ ${#alive[@]} -gt 0 ]; then
    kill -TERM "${alive[@]}" 2>/dev/null || true
    for _ in $(seq 50); do
      local any=0
      for p in "${alive[@]}"; do kill -0 "$p" 2>/dev/null && any=1; done
      [ "$any" = 0 ] && break
      sleep 0.1
    done
    kill -KILL "${alive[@]}" 2>/dev/null || true
  fi
  wait 2>/dev/null || true
}

# cluster_fail NAME PID CODE: names the process, shows its log, exits 1.
cluster_fail() {
  echo "$launcher: $1 (pid $2) exited with code $3; last lines of $logdir/$1.log:" >&2
  tail -n 15 "$logdir/$1.log" >&2 || true
  exit 1
}

# cluster_track NAME PID [worker]: remembers a started process.
cluster_track() {
  pids+=("$2")
  name_of[$2]=$1
  [ "${3:-}" = worker ] && worker_pids+=("$2")
  return 0
}

# cluster_start_etcd ETCD_BIN [PKI_DIR]: a one-member etcd on free loopback
# ports, its data in $logdir/etcd, stopped with everything else; elections
# in 0.5 s so that it grants 1 s leases (ps_server --lease_ms=1000). With
# PKI_DIR (ca.pem, server.pem, server.key) it serves TLS and requires
# client certificates signed by ca.pem. Sets etcd_endpoint to
# "127.0.0.1:port".
cluster_start_etcd() {
  local bin=$1 pki=${2:-} client peer pid scheme=http
  local tls_args=()
  if [ -n "$pki" ]; then
    scheme=https
    tls_args=(--cert-file="$pki/server.pem" --key-file="$pki/server.key"
      --trusted-ca-file="$pki/ca.pem" --client-cert-auth)
  fi
  client=$(cluster_free_port)
  peer=$(cluster_free_port "$client")
  "$bin" --name=local --data-dir="$logdir/etcd" \
    --listen-client-urls="$scheme://127.0.0.1:$client" \
    --advertise-client-urls="$scheme://127.0.0.1:$client" "${tls_args[@]}" \
    --listen-peer-urls="http://127.0.0.1:$peer" \
    --initial-advertise-peer-urls="http://127.0.0.1:$peer" \
    --initial-cluster="local=http://127.0.0.1:$peer" \
    --heartbeat-interval=50 --election-timeout=500 --log-level=warn \
    >"$logdir/etcd.log" 2>&1 &
  pid=$!
  cluster_track etcd "$pid"
  etcd_endpoint="127.0.0.1:$client"
  for _ in $(seq 100); do
    (echo >"/dev/tcp/127.0.0.1/$client") 2>/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || cluster_fail etcd "$pid" "$?"
    sleep 0.1
  done
  echo "$launcher: etcd did not start within 10 s" >&2
  exit 1
}

# cluster_free_port [NOT]: a loopback port nothing listens on (other than
# NOT).
cluster_free_port() {
  local p
  while :; do
    p=$((20000 + RANDOM % 40000))
    [ "$p" = "${1:-}" ] && continue
    (echo >"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
}

# cluster_start_shards SERVER_BIN SHARDS "EXTRA FLAGS" [REPLICAS]: starts
# the shards (REPLICAS processes each, default 1, named shard<i> or
# shard<i>.r<k>, with host labels replica<k>; their TMPDIR the log folder,
# so that a killed replica's snapshot directory stays there, not in /tmp)
# on port 0 and waits (30 s at most) for each to write its port; sets
# servers to
# "127.0.0.1:p0,127.0.0.1:p1,..." (the first process of each shard).
cluster_start_shards() {
  local bin=$1 shards=$2 flags=$3 replicas=${4:-1} i k name pid rc
  local names=()
  servers=""
  for ((i = 0; i < shards; i++)); do
    for ((k = 0; k < replicas; k++)); do
      name="shard$i"
      [ "$replicas" -gt 1 ] && name="shard$i.r$k"
      rm -f "$logdir/$name.port"
      # shellcheck disable=SC2086
      TMPDIR="$logdir" "$bin" --shard_index=$i --num_shards="$shards" --host=127.0.0.1 \
        --port=0 --port_file="$logdir/$name.port" \
        $([ "$replicas" -gt 1 ] && echo "--host_label=replica$k") $flags \
        >"$logdir/$name.log" 2>&1 &
      cluster_track "$name" $!
      names+=("$name:$!")
      # The first replica of a group claims it; the others join it.
      [ "$replicas" -gt 1 ] && [ "$k" = 0 ] && cluster_wait_port "$name" "$!"
    done
  done
  for entry in "${names[@]}"; do
    cluster_wait_port "${entry%%:*}" "${entry##*:}"
    case "${entry%%:*}" in
      *.r0 | shard[0-9]) ;;
      *) continue ;;
    esac
    servers="${servers:+$servers,}127.0.0.1:$(cat "$logdir/${entry%%:*}.port")"
  done
}

# cluster_start_standbys SERVER_BIN SHARDS "EXTRA FLAGS" COUNT: COUNT more
# processes of a replicated run, each a spare of whichever shard needs one
# (--shard_index=any; named spare<k>, host labels spare<k>, each on a port
# the OS picks and the process holds while it stands by: it writes no port
# file until it joins), which stand by while every group has its R
# replicas; waits (30 s at most) until each says so.
cluster_start_standbys() {
  local bin=$1 shards=$2 flags=$3 count=$4 k name pid
  for ((k = 0; k < count; k++)); do
    name="spare$k"
    # shellcheck disable=SC2086
    TMPDIR="$logdir" "$bin" --shard_index=any --num_shards="$shards" --host=127.0.0.1 \
      --port=0 --host_label="spare$k" $flags \
      >"$logdir/$name.log" 2>&1 &
    pid=$!
    cluster_track "$name" "$pid"
    for _ in $(seq 300); do
      grep -q "stands by" "$logdir/$name.log" 2>/dev/null && break
      kill -0 "$pid" 2>/dev/null || cluster_fail "$name" "$pid" "$?"
      sleep 0.1
    done
    grep -q "stands by" "$logdir/$name.log" ||
      { echo "$launcher: $name did not stand by within 30 s" >&2; exit 1; }
  done
}

# cluster_wait_port NAME PID: waits (30 s at most) for NAME's port file.
cluster_wait_port() {
  local name=$1 pid=$2 rc
  for _ in $(seq 300); do
    [ -s "$logdir/$name.port" ] && return 0
    if ! kill -0 "$pid" 2>/dev/null; then
      wait "$pid" && rc=0 || rc=$?
      cluster_fail "$name" "$pid" "$rc"
    fi
    sleep 0.1
  done
  echo "$launcher: $name did not start within 30 s" >&2
  exit 1
}

# Waits for every worker; stops at the first process that fails (a shard
# that stops counts as failed).
cluster_wait_workers() {
  local remaining=${#worker_pids[@]} rc name done_pid i
  while [ "$remaining" -gt 0 ]; do
    set +e
    wait -n -p done_pid "${pids[@]}"
    rc=$?
    set -e
    name=${name_of[$done_pid]:-unknown}
    if [ "$rc" != 0 ] && ! [[ "$name" =~ ^(shard.*\.r|spare)[0-9]+$ ]]; then
      [ -f "$logdir/$name.out" ] && cat "$logdir/$name.out" >>"$logdir/$name.log"
      cluster_fail "$name" "$done_pid" "$rc"
    fi
    case "$name" in
      shard*.r* | spare*)
        # A replica (or spare) of a replicated shard: its group goes on
        # without it (a spare takes its place); a group that lost every
        # replica fails its workers, which ends the run.
        echo "$launcher: $name (pid $done_pid) exited with code $rc; its shard group goes on without it" >&2 ;;
      shard* | etcd) cluster_fail "$name" "$done_pid" "$rc (it stopped during training)" ;;
      worker*) remaining=$((remaining - 1)) ;;
    esac
    # Drop the finished pid so wait -n does not see it again.
    for i in "${!pids[@]}"; do [ "${pids[$i]}" = "$done_pid" ] && unset 'pids[i]'; done
    pids=("${pids[@]}")
  done
}

# cluster_report SHARDS "N worker(s)": wall time, summed examples/s of the
# workers' "done: ... (X examples/s)" lines and worker 0's final accuracy
# (or its "final test auc: ..." line, for ps_worker --model=ctr); returns 1
# when there is neither.
cluster_report() {
  local end acc auc rate wall
  end=$(date +%s%N)
  acc=$(grep -h '^final test accuracy:' "$logdir"/worker0.out | tail -n 1 | awk '{print $4}' || true)
  auc=$(grep -h '^final test auc:' "$logdir"/worker0.out | tail -n 1 || true)
  # Sum of the workers' examples/s and the wall time, with awk (no bc).
  rate=$(grep -h ' done: ' "$logdir"/worker*.out |
    sed -E 's/.*[ (]([0-9.]+) examples\/s.*/\1/' |
    awk '{ s += $1; n++ } END { if (n) printf "%.0f", s }')
  wall=$(awk -v a="$cluster_start" -v b="$end" 'BEGIN { printf "%.1f", (b - a) / 1e9 }')
  printf 'cluster of %d shard(s) and %s: %s s wall, %s examples/s in total\n' \
    "$1" "$2" "$wall" "${rate:-?}"
  if [ -n "$auc" ]; then
    echo "$auc"
    return 0
  fi
  echo "final test accuracy: ${acc:-unknown}"
  [ -n "$acc" ]
}
