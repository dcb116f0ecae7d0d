#!/usr/bin/env bash
# Launch test for deploy/slurm/asyncps.sbatch on a real, private, one-node
# Slurm cluster on this machine. Run as root from anywhere:
#
#   tests/deploy/slurm_launch_test.sh
#
# Not part of tests/run.sh: it installs Debian packages (slurm-wlm, munge,
# etcd-server, dataset-fashion-mnist) when missing and starts system daemons. It leaves the
# machine's own Slurm and munge setup alone: munged, slurmctld and slurmd run
# from a temporary folder with their own key, socket, config (SLURM_CONF),
# state, spool and free TCP ports, and are stopped (by PID) at the end.
#
# What it checks:
#   1. a 2-shard, 2-worker, 1-epoch job completes with exit 0 (sbatch --wait
#      and `scontrol show job`), reports `final test accuracy` >= 0.78, shows
#      `psctl status` with every shard up, and stops its shards with SIGTERM;
#   1r. a 2-shard job with ASYNCPS_REPLICAS=2 (2 x 2 ps_server processes and
#      an etcd), 2 workers, 1 epoch: exit 0, accuracy >= 0.78, `psctl status`
#      (read through etcd) shows each shard with a primary and a caught-up
#      backup and exits 0, every replica stops with SIGTERM, and no
#      ps_server/ps_worker/etcd is left;
#   1k. the same with 3 epochs, ASYNCPS_STANDBYS=1 (a spare of any shard that
#      stands by), and shard 0's primary killed with SIGKILL while the
#      workers train: its backup takes over, the spare joins shard 0, the
#      job ends with exit 0 and `psctl status` shows two caught-up replicas
#      of each shard again;
#   2. a job whose workers fail (bad flag) ends non-zero, names the failure and
#      still stops its shards;
#   3. a job signalled as before its time limit (scancel --signal=TERM
#      --batch, what --signal=B:TERM@120 sends) stops cleanly, requeues
#      itself, and its second start restores the shards' checkpoints and
#      finishes training with exit 0;
#   4. no ps_server/ps_worker of these jobs, and no daemon of this cluster, is
#      left afterwards.
# Every job script runs with bash 4.4's `wait` (no -p option; BASH_ENV
# defines a `wait` that refuses it), as on EL8 and Ubuntu 20.04.
# Ends with `N passed, N failed`; exits non-zero on any failure.
#
# Environment: ASYNCPS_BIN=DIR uses binaries already built there (flat or
# Bazel's layout) instead of running `bazel build`; KEEP_TMP=1 keeps the
# temporary folder (logs, job output) for a look afterwards.
#
# Cluster choices: proctrack/linuxproc and task/none, because proctrack/cgroup
# fails in containers without a usable freezer hierarchy (slurmstepd: "cgroup
# namespace 'freezer' not mounted", and the batch step never starts); no
# slurmdbd, so `sacct` has no data and the job's state and exit code come from
# `scontrol show job` (kept for MinJobAge) and `sbatch --wait`'s exit status.
#
# Every wait is bounded; after the packages and binaries are in place the test
# takes about 4 to 5 minutes, most of it Slurm holding the requeued job of case
# 3 (BeginTime) before its second start.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
repo=$(pwd)

passed=0
failed=0
check() {  # name, then a command that succeeds when the check passes
  local name=$1
  shift
  if "$@"; then
    echo "PASS: $name"
    passed=$((passed + 1))
  else
    echo "FAIL: $name"
    failed=$((failed + 1))
  fi
}
summary() {
  echo "$passed passed, $failed failed"
  [ "$failed" = 0 ]
}
abort() {  # message: a setup step failed; nothing further can be checked
  echo "slurm_launch_test: $*" >&2
  failed=$((failed + 1))
  exit 1
}

[ "$(id -u)" = 0 ] || { echo "slurm_launch_test: run as root (it installs packages and starts daemons)" >&2; echo "0 passed, 1 failed"; exit 1; }

tmp=""
job_tag=""
daemon_tag=""
munged_pid=""
ctld_pid=""
slurmd_pid=""

stop_pid() {  # pid, seconds to wait after SIGTERM
  local pid=$1 i
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null
  for ((i = 0; i < $2 * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  return 0
}

# PIDs of this test's processes, found by a tag in their environment:
#   own_pids job  - processes of the jobs (submitted with job_tag: job scripts,
#                   srun, ps_server/ps_worker/psctl) and anything running a
#                   binary copied into $tmp/bin;
#   own_pids all  - those and the daemons' helpers (started with daemon_tag:
#                   slurmscriptd, slurmstepd), less the three daemons' PIDs.
# Nothing else on the machine carries these tags.
own_pids() {
  [ -n "$tmp" ] || return 0
  local tags=(-e "$job_tag") f p
  [ "$1" = all ] && tags+=(-e "$daemon_tag")
  {
    grep -lzxF "${tags[@]}" /proc/[0-9]*/environ 2>/dev/null
    find /proc/[0-9]*/exe -maxdepth 0 -lname "$tmp/bin/*" 2>/dev/null
  } | while read -r f; do
    p=${f#/proc/}
    p=${p%%/*}
    case "$p" in "$munged_pid"|"$ctld_pid"|"$slurmd_pid") continue ;; esac
    echo "$p"
  done | sort -un
}

cleanup() {
  trap - EXIT INT TERM
  if [ -n "$ctld_pid" ] && kill -0 "$ctld_pid" 2>/dev/null; then
    timeout 10 scancel --partition=asyncps 2>/dev/null
  fi
  stop_pid "$slurmd_pid" 10
  stop_pid "$ctld_pid" 10
  stop_pid "$munged_pid" 5
  # Left-overs of this cluster only (see own_pids), by PID.
  local p
  for p in $(own_pids all); do kill -KILL "$p" 2>/dev/null; done
  if [ -n "$tmp" ]; then
    if [ "${KEEP_TMP:-0}" = 1 ]; then echo "kept $tmp"; else rm -rf "$tmp"; fi
  fi
  summary
  exit $?
}
trap cleanup EXIT
trap 'echo "interrupted"; failed=$((failed + 1)); exit 1' INT TERM

# --- packages, binaries, data --------------------------------------------
need=()
for c in slurmctld slurmd sbatch munged; do command -v "$c" >/dev/null || need=(slurm-wlm munge); done
command -v etcd >/dev/null || need+=(etcd-server)
[ -s /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || need+=(dataset-fashion-mnist)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]} ..."
  export DEBIAN_FRONTEND=noninteractive
  timeout 240 apt-get install -y -q "${need[@]}" >/dev/null ||
    { timeout 120 apt-get update -q >/dev/null; timeout 240 apt-get install -y -q "${need[@]}" >/dev/null; } ||
    abort "apt-get install ${need[*]} failed"
fi

tmp=$(mktemp -d -t asyncps-slurm.XXXXXX) || abort "mktemp failed"
job_tag="ASYNCPS_SLURM_TEST_JOB=$tmp"
daemon_tag="ASYNCPS_SLURM_TEST_DAEMON=$tmp"
# munged wants every folder above its socket searchable by all.
chmod 755 "$tmp"
mkdir -p "$tmp"/{bin,etc,state,spool,log,submit} && mkdir -m 755 "$tmp/run" && mkdir -m 700 "$tmp/munge"

if [ -n "${ASYNCPS_BIN:-}" ]; then
  bin=$ASYNCPS_BIN
else
  echo "building ps_server, ps_worker, psctl ..."
  timeout 1800 bazel build //server:ps_server //worker:ps_worker //tools:psctl >"$tmp/log/build.log" 2>&1 ||
    { tail -n 20 "$tmp/log/build.log"; abort "bazel build failed"; }
  bin=$(bazel info bazel-bin 2>/dev/null)
fi
# Private copies: a concurrent rebuild cannot swap them under a running job,
# and their path tells this test's processes apart from any other.
for b in server/ps_server worker/ps_worker tools/psctl; do
  n=${b#*/}
  if [ -x "$bin/$b" ]; then cp "$bin/$b" "$tmp/bin/"
  elif [ -x "$bin/$n" ]; then cp "$bin/$n" "$tmp/bin/"
  else abort "$n not found in $bin"
  fi
done

# --- munge ----------------------------------------------------------------
dd if=/dev/urandom of="$tmp/munge/munge.key" bs=1024 count=1 status=none && chmod 400 "$tmp/munge/munge.key"
munge_sock=$tmp/run/munge.sock
env "$daemon_tag" munged -F --socket="$munge_sock" --key-file="$tmp/munge/munge.key" \
  --pid-file="$tmp/run/munged.pid" --seed-file="$tmp/munge/munged.seed" \
  --log-file="$tmp/log/munged.log" >"$tmp/log/munged.out" 2>&1 &
munged_pid=$!
for _ in $(seq 100); do [ -S "$munge_sock" ] && break; kill -0 "$munged_pid" 2>/dev/null || break; sleep 0.1; done
if ! timeout 10 munge -S "$munge_sock" -n </dev/null | timeout 10 unmunge -S "$munge_sock" >/dev/null 2>&1; then
  cat "$tmp/log/munged.out" >&2
  abort "munged does not answer on its socket"
fi

# --- slurm.conf -------------------------------------------------------------
free_port() {  # a TCP port nothing listens on, not in $1
  local p
  for _ in $(seq 50); do
    p=$((20000 + RANDOM % 40000))
    [ "$p" = "${1:-}" ] && continue
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return 0; }
  done
  return 1
}
ctld_port=$(free_port) && slurmd_port=$(free_port "$ctld_port") || abort "no free TCP port"
# 2 x 2 replicas + a spare + 2 workers need 7 task slots; a smaller machine
# is declared with 7 CPUs (config_overrides keeps slurmd from draining the
# node for it).
cpus=$(nproc)
[ "$cpus" -lt 7 ] && cpus=7
export SLURM_CONF=$tmp/etc/slurm.conf
: >"$tmp/etc/plugstack.conf"
cat >"$SLURM_CONF" <<EOF
ClusterName=asyncpstest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$munge_sock
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/run/slurmctld.pid
SlurmdPidFile=$tmp/run/slurmd.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd.log
PlugStackConfig=$tmp/etc/plugstack.conf
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=10
MinJobAge=600
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=1000 State=UNKNOWN
PartitionName=asyncps Nodes=localhost Default=YES MaxTime=30 State=UP
EOF

# --- daemons ----------------------------------------------------------------
env "$daemon_tag" slurmctld -D -i >"$tmp/log/slurmctld.out" 2>&1 &
ctld_pid=$!
env "$daemon_tag" slurmd -D -N localhost >"$tmp/log/slurmd.out" 2>&1 &
slurmd_pid=$!
state=""
for _ in $(seq 60); do
  state=$(timeout 5 sinfo -h -N -n localhost -o %T 2>/dev/null)
  [ "$state" = idle ] && break
  kill -0 "$ctld_pid" 2>/dev/null && kill -0 "$slurmd_pid" 2>/dev/null || break
  sleep 1
done
if [ "$state" != idle ]; then
  echo "node state: '${state:-none}'" >&2
  tail -n 15 "$tmp/log/slurmctld.out" "$tmp/log/slurmd.out" >&2
  abort "the Slurm node did not become idle within 60 s"
fi
echo "slurm cluster up (slurmctld :$ctld_port, slurmd :$slurmd_port, $cpus CPUs)"

# bash < 5.1: `wait` has no -p option (the job scripts source this).
cat >"$tmp/etc/bash44.sh" <<'EOF'
wait() {
  local a
  for a in "$@"; do
    [ "$a" = -p ] && { echo "bash: wait: -p: invalid option (bash 4.4)" >&2; return 2; }
  done
  builtin wait "$@"
}
EOF

submit() {  # output prefix, extra env (ASSIGN=... ,...)[, sbatch options] -> sets job_id, job_rc, job_out
  local prefix=$1 env=$2
  job_id=""
  job_out=""
  # shellcheck disable=SC2086  # $3: sbatch options, split
  (cd "$tmp/submit" && env "$job_tag" timeout 240 sbatch --wait --parsable --time=4 ${3:-} \
     --output="$tmp/submit/$prefix-%j.out" \
     --export="ALL,ASYNCPS_BIN=$tmp/bin,BASH_ENV=$tmp/etc/bash44.sh,$env" \
     "$repo/deploy/slurm/asyncps.sbatch" >"$tmp/log/$prefix.sbatch" 2>&1)
  job_rc=$?
  job_id=$(grep -oE '^[0-9]+' "$tmp/log/$prefix.sbatch" | head -n 1)
  [ -n "$job_id" ] && job_out=$tmp/submit/$prefix-$job_id.out
  echo "job ${job_id:-?} ($prefix): sbatch exit $job_rc"
  [ -n "$job_out" ] && [ -f "$job_out" ] && sed 's/^/  | /' "$job_out"
}
job_field() {  # field of `scontrol show job $job_id`
  timeout 10 scontrol show job "$job_id" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$1=//p" | head -n 1
}
none_left() {  # [all]: no process of this test's jobs (or cluster) within 15 s
  local left p
  for _ in $(seq 75); do
    left=$(own_pids "${1:-job}")
    [ -z "$left" ] && return 0
    sleep 0.2
  done
  echo "left behind:"; for p in $left; do echo "  $p $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)"; done
  return 1
}
shards_stopped_cleanly() {  # [count]: every shard log of the job (2) ends with a clean stop
  local f n=0
  for f in "$tmp/submit/asyncps-$job_id"/shard*.log; do
    [ -f "$f" ] || continue
    n=$((n + 1))
    grep -q 'shard stopped' "$f" || { echo "no clean stop in $f"; tail -n 3 "$f"; return 1; }
  done
  [ "$n" = "${1:-2}" ]
}

# --- 1. a training job ------------------------------------------------------
start=$(date +%s)
submit train "ASYNCPS_SHARDS=2,ASYNCPS_WORKERS=2,ASYNCPS_EPOCHS=1"
echo "train job took $(($(date +%s) - start)) s (submission to sbatch --wait returning)"
acc=""
[ -n "$job_out" ] && acc=$(sed -n 's/^final test accuracy: \([0-9.]*\)$/\1/p' "$job_out" | tail -n 1)
echo "final test accuracy: ${acc:-none}"
check "training job: sbatch --wait exits 0" test "$job_rc" = 0
check "training job: scontrol shows COMPLETED" test "$(job_field JobState)" = COMPLETED
check "training job: scontrol shows ExitCode=0:0" test "$(job_field ExitCode)" = 0:0
check "training job: final test accuracy >= 0.78 after 1 epoch" \
  awk -v a="${acc:-0}" 'BEGIN { exit !(a >= 0.78) }'
check "training job: psctl status shows 2/2 shards up" grep -q 'cluster: 2/2 shards up' "${job_out:-/dev/null}"
check "training job: shards stopped with SIGTERM" shards_stopped_cleanly
check "training job: no ps_server/ps_worker left" none_left

training_job() {  # output prefix, epochs: echoes the id of that (background)
  # job once its workers are training (at most 120 s)
  local out id
  for _ in $(seq 600); do
    out=$(find "$tmp/submit" -maxdepth 1 -name "$1-*.out" | head -n 1)
    if [ -n "$out" ] && grep -q "epoch 1/$2 step 200/" "$out"; then
      id=${out##*-}
      echo "${id%.out}"
      return 0
    fi
    sleep 0.2
  done
  return 1
}

# --- 1r. replicated shards -------------------------------------------------
replicas_caught_up() {  # psctl status: every shard a primary + a caught-up backup
  grep -q 'cluster: 2/2 shards up' "$job_out" && ! grep -q 'psctl status exited' "$job_out" &&
    awk '/^--- psctl status/ { on = 1; next }
         on && $1 ~ /^[0-9]+$/ && ($2 == "primary" || $2 == "backup") { n[$1]++ }
         END { exit !(n[0] == 2 && n[1] == 2) }' "$job_out"
}
replicated="ASYNCPS_SHARDS=2,ASYNCPS_REPLICAS=2,ASYNCPS_WORKERS=2"
start=$(date +%s)
submit replicated "$replicated,ASYNCPS_EPOCHS=1" --ntasks=6
echo "replicated job took $(($(date +%s) - start)) s (submission to sbatch --wait returning)"
acc=""
[ -n "$job_out" ] && acc=$(sed -n 's/^final test accuracy: \([0-9.]*\)$/\1/p' "$job_out" | tail -n 1)
check "replicated job: sbatch --wait exits 0" test "$job_rc" = 0
check "replicated job: scontrol shows COMPLETED" test "$(job_field JobState)" = COMPLETED
check "replicated job: final test accuracy >= 0.78 after 1 epoch" \
  awk -v a="${acc:-0}" 'BEGIN { exit !(a >= 0.78) }'
check "replicated job: etcd started" grep -q 'asyncps.sbatch: etcd at ' "${job_out:-/dev/null}"
check "replicated job: psctl status shows 2 caught-up replicas per shard" replicas_caught_up
check "replicated job: all 4 replicas stopped with SIGTERM" shards_stopped_cleanly 4
check "replicated job: no ps_server/ps_worker/etcd left" none_left

# --- 1k. a primary killed mid-job, a spare standing by ------------------------
# 3 epochs: the workers are still training when shard 0's primary is killed.
# Not requeued, and signalled after 1 minute (--time=3): a job that stalls
# fails here instead of starting again.
submit failover "$replicated,ASYNCPS_EPOCHS=3,ASYNCPS_REQUEUE=0,ASYNCPS_STANDBYS=1" "--ntasks=7 --time=3" &
submit_pid=$!
killed=""
if id=$(training_job failover 3); then
  # The process that claimed shard 0, found by its port file argument.
  name=$(grep -l "claimed shard 0 as its primary" "$tmp/submit/asyncps-$id"/shard0.r*.log | head -n 1)
  name=${name##*/}
  for p in $(own_pids job); do
    tr '\0' '\n' <"/proc/$p/cmdline" 2>/dev/null | grep -q -- "--port_file=.*/${name%.log}.port$" &&
      kill -KILL "$p" && killed=${name%.log}
  done
fi
wait "$submit_pid"
job_id=${id:-none}  # submit ran in a subshell
check "failover job: shard 0's primary was killed with SIGKILL while the workers trained" test -n "$killed"
check "failover job: its backup took over" \
  grep -q "took over shard 0 as its primary" "$tmp/submit/asyncps-$job_id"/shard0.r*.log
check "failover job: the spare stood by, then joined shard 0" \
  grep -q "joined shard 0 as a spare" "$tmp/submit/asyncps-$job_id/spare0.log"
check "failover job: scontrol shows COMPLETED with ExitCode=0:0" \
  test "$(job_field JobState) $(job_field ExitCode)" = "COMPLETED 0:0"
job_out=$tmp/submit/failover-$job_id.out
check "failover job: psctl status shows 2 caught-up replicas per shard again" replicas_caught_up
check "failover job: no ps_server/ps_worker/etcd left" none_left

# --- 2. a job whose workers fail --------------------------------------------
submit fail "ASYNCPS_SHARDS=2,ASYNCPS_WORKERS=2,ASYNCPS_EPOCHS=1,ASYNCPS_WORKER_FLAGS=--optimizer=bogus"
check "failing job: sbatch --wait exits non-zero" test "$job_rc" != 0
check "failing job: scontrol shows FAILED" test "$(job_field JobState)" = FAILED
check "failing job: the output names the worker error" \
  grep -q -- "--optimizer must be" "${job_out:-/dev/null}"
check "failing job: shards stopped with SIGTERM" shards_stopped_cleanly
check "failing job: no ps_server/ps_worker left" none_left

# --- 3. a job signalled before its time limit requeues itself ---------------
# sbatch --wait in the background; SIGTERM to the batch shell once the
# workers train; --wait returns when the requeued job has finished.
# 6 epochs: the workers are still training when the signal comes.
submit requeue "ASYNCPS_SHARDS=2,ASYNCPS_WORKERS=2,ASYNCPS_EPOCHS=6" &
submit_pid=$!
signalled=""
id=$(training_job requeue 6) && timeout 10 scancel --signal=TERM --batch "$id" && signalled=$id
wait "$submit_pid"
job_id=${signalled:-none}
job_out=$tmp/submit/requeue-$job_id.out
[ -f "$job_out" ] && sed 's/^/  | /' "$job_out"
check "requeue: the batch shell was signalled while the workers trained" test -n "$signalled"
check "requeue: the job requeued itself after a clean stop" \
  grep -q "requeueing job $job_id" "$job_out"
check "requeue: the first start stopped before the workers finished" \
  test "$(grep -c "final test accuracy" "$job_out")" = 1
check "requeue: the second start ended with exit 0" test "$(job_field ExitCode)" = 0:0
check "requeue: scontrol shows COMPLETED after one restart" \
  test "$(job_field JobState) $(job_field Restarts)" = "COMPLETED 1"
restored_both() {  # both shards restored a checkpoint at the second start
  local i
  for i in 0 1; do
    grep -q "restored checkpoint" "$tmp/submit/asyncps-$job_id/shard$i.log" ||
      { echo "shard $i restored nothing"; return 1; }
  done
}
check "requeue: the second start restored both shards' checkpoints" restored_both
acc=$(sed -n 's/^final test accuracy: \([0-9.]*\)$/\1/p' "$job_out" 2>/dev/null | tail -n 1)
check "requeue: the second start reached the accuracy floor" \
  awk -v a="${acc:-0}" 'BEGIN { exit !(a >= 0.78) }'
check "requeue: no ps_server/ps_worker left" none_left

# --- 4. the cluster goes away -----------------------------------------------
timeout 10 scancel --partition=asyncps 2>/dev/null
stop_pid "$slurmd_pid" 10
stop_pid "$ctld_pid" 10
stop_pid "$munged_pid" 5
daemons_gone() {
  local p
  for p in "$slurmd_pid" "$ctld_pid" "$munged_pid"; do kill -0 "$p" 2>/dev/null && return 1; done
  none_left all
}
check "slurmd, slurmctld, munged and their steps stopped" daemons_gone
slurmd_pid=""
ctld_pid=""
munged_pid=""
