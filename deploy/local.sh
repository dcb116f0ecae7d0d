#!/usr/bin/env bash
# Runs a local asyncps cluster on loopback: S server shards and W workers
# training an MLP on Fashion-MNIST, then prints the final test accuracy (or,
# with --model ctr, a click model with sparse embedding tables on a synthetic
# click log, then the final test AUC beside the Bayes-optimal one).
# Installs missing Debian packages and builds first. Leaves no process
# behind: on Ctrl-C, on any process failing (named, with its last log lines,
# exit 1), and at the end.
#
#   deploy/local.sh                      # 2 shards, 4 workers, defaults
#   deploy/local.sh --shards 3 --workers 2 --epochs 5 --hidden 512,256
#   deploy/local.sh --server-flags "--consistency=ssp --ssp_slack=3" \
#                   --worker-flags "--optimizer=adam --lr=0.001"
#   deploy/local.sh --model ctr          # embedding tables, prints the AUC
#   deploy/local.sh --serve              # also serve the model as it trains
#   deploy/local.sh --tls                # TLS and a cluster token throughout
#   ASYNCPS_BIN=/opt/asyncps/bin deploy/local.sh   # prebuilt binaries
set -euo pipefail
cd "$(dirname "$0")/.."

shards=2
replicas=1
standbys=0
workers=4
model=mlp
epochs=20
epochs_set=0
hidden="256,128"
hidden_set=0
server_flags=""
worker_flags=""
logdir=""
straggler=""
build=1
serve=0
tls=0
bazel_flags=()

usage() {
  cat <<USAGE
Usage: deploy/local.sh [options]

Runs a local asyncps cluster on loopback: shards and workers training an MLP
on Fashion-MNIST, then prints the final test accuracy; with --model ctr, a
DLRM-like click model (one sparse embedding table per categorical field, an
MLP on top) on a synthetic click log with a known ground truth, then
"final test auc: 0.XXXX (bayes-optimal 0.XXXX)". Installs missing
Debian packages and builds first (unless ASYNCPS_BIN names prebuilt
binaries). Stops every process it started: on Ctrl-C, when one fails (named,
with its last log lines, exit 1), and at the end.

options:
  --shards N           server shards (default $shards)
  --replicas R         server processes per shard (default $replicas); R > 1
                       also starts a one-member etcd (free ports, stopped
                       with everything else) holding the shard map, and the
                       workers follow each shard's primary through it (see
                       README "Replicated shards")
  --standbys K         with --replicas: K more server processes, each a
                       spare of whichever shard needs one (ps_server
                       --shard_index=any): they stand by until a group has
                       fewer than R replicas (a replica killed: one takes
                       its place); default 0. With --replicas, a replica
                       that dies does not stop the run: its group goes on
  --workers N          workers (default $workers)
  --model mlp|ctr      the model (default $model); ctr trains on the shards'
                       sparse tables (see ps_worker --help=ctr)
  --epochs N           epochs per worker over its share (default $epochs; ctr: 1)
  --hidden SIZES       hidden layers, e.g. 256,128; "" = softmax regression
                       (ctr: default 64,32)
  --server-flags "..." extra ps_server flags (see ps_server --help)
  --worker-flags "..." extra ps_worker flags (see ps_worker --help)
  --straggler ID:MS    make worker ID sleep MS milliseconds every step
  --serve              also start ps_serve on the shards (KServe v2: gRPC and
                       REST, ports in the log folder) and a client that
                       classifies the test set through it every few seconds,
                       then prints "served test accuracy: ..." of the final
                       model (mlp only)
  --tls                every connection in TLS with a cluster token: makes a
                       throwaway CA, a certificate for 127.0.0.1 and a token
                       in the log folder (pki/), and gives the servers
                       --tls_cert/--tls_key/--tls_ca/--cluster_token_file
                       and the workers (and ps_serve) --tls_ca and
                       --cluster_token_file (see README "Security"); with
                       --replicas, etcd serves TLS too and requires a
                       client certificate (--etcd_ca/--etcd_cert/--etcd_key)
  --logdir DIR         keep logs here (default: a fresh temporary folder)
  --cuda               build and run the CUDA build (bazel --config=cuda)
  --no-build           use the binaries already built (bazel-bin)
  -h, --help           this text

environment:
  ASYNCPS_BIN=DIR      use ps_server and ps_worker from DIR (flat, or
                       Bazel's layout server/ and worker/); no install, no
                       build
  ASYNCPS_*            other ASYNCPS_<FLAG> variables reach the binaries as
                       flag values (see ps_server --help)
USAGE
}

while [ $# -gt 0 ]; do
  case "$1" in
    --shards) shards="$2"; shift 2 ;;
    --replicas) replicas="$2"; shift 2 ;;
    --standbys) standbys="$2"; shift 2 ;;
    --workers) workers="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --epochs) epochs="$2"; epochs_set=1; shift 2 ;;
    --hidden) hidden="$2"; hidden_set=1; shift 2 ;;
    --server-flags) server_flags="$2"; shift 2 ;;
    --worker-flags) worker_flags="$2"; shift 2 ;;
    --logdir) logdir="$2"; shift 2 ;;
    --straggler) straggler="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    --serve) serve=1; shift ;;
    --tls) tls=1; shift ;;
    --cuda) bazel_flags=(--config=cuda); shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "local.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for v in shards replicas workers epochs; do
  if ! [[ "${!v}" =~ ^[1-9][0-9]*$ ]]; then
    echo "local.sh: --$v must be a positive integer, got '${!v}'" >&2; exit 2
  fi
done
if ! [[ "$standbys" =~ ^[0-9]+$ ]]; then
  echo "local.sh: --standbys must be a count, got '$standbys'" >&2; exit 2
fi
if [ "$standbys" -gt 0 ] && [ "$replicas" -lt 2 ]; then
  echo "local.sh: --standbys needs --replicas 2 or more" >&2; exit 2
fi
case "$model" in
  mlp) model_flags=(--epochs="$epochs" --hidden="$hidden") ;;
  ctr)
    # The CTR model's own defaults, unless given.
    model_flags=(--model=ctr)
    [ "$epochs_set" = 1 ] && model_flags+=(--epochs="$epochs")
    [ "$hidden_set" = 1 ] && model_flags+=(--hidden="$hidden")
    ;;
  *) echo "local.sh: --model must be mlp or ctr, got '$model'" >&2; exit 2 ;;
esac

# The binary `name` in folder $1, flat or in Bazel's layout ($2/name).
find_bin() {
  if [ -x "$1/$3" ]; then echo "$1/$3"; else echo "$1/$2/$3"; fi
}

if [ -n "${ASYNCPS_BIN:-}" ]; then
  bin=$ASYNCPS_BIN
elif [ "$build" = 1 ]; then
  deploy/install_deps.sh
  echo "building ps_server, ps_worker and psctl ..."
  build_log=$(mktemp)
  targets=(//server:ps_server //worker:ps_worker //tools:psctl)
  [ "$serve" = 1 ] && targets+=(//serving:ps_serve //serving:ps_serve_eval)
  if ! bazel build "${bazel_flags[@]}" "${targets[@]}" >"$build_log" 2>&1; then
    grep -E 'ERROR|error:' "$build_log" >&2 || tail -n 20 "$build_log" >&2
    rm -f "$build_log"
    echo "local.sh: build failed; nothing started" >&2
    exit 1
  fi
  rm -f "$build_log"
  bin=$(bazel info "${bazel_flags[@]}" bazel-bin 2>/dev/null)
else
  bin=$(bazel info "${bazel_flags[@]}" bazel-bin 2>/dev/null)
fi
server_bin=$(find_bin "$bin" server ps_server)
worker_bin=$(find_bin "$bin" worker ps_worker)
[ -x "$server_bin" ] && [ -x "$worker_bin" ] || {
  echo "local.sh: no ps_server/ps_worker in $bin (set ASYNCPS_BIN, or run without --no-build)" >&2
  exit 1
}
if [ "$serve" = 1 ]; then
  [ "$model" = mlp ] || { echo "local.sh: --serve serves the mlp model only" >&2; exit 2; }
  serve_bin=$(find_bin "$bin" serving ps_serve)
  eval_bin=$(find_bin "$bin" serving ps_serve_eval)
  [ -x "$serve_bin" ] && [ -x "$eval_bin" ] || {
    echo "local.sh: no ps_serve/ps_serve_eval in $bin" >&2
    exit 1
  }
fi

straggler_id=-1
straggler_ms=0
if [ -n "$straggler" ]; then
  if ! [[ "$straggler" =~ ^([0-9]+):([0-9]+)$ ]]; then
    echo "local.sh: --straggler must be ID:MS, got '$straggler'" >&2; exit 2
  fi
  straggler_id=${BASH_REMATCH[1]}
  straggler_ms=${BASH_REMATCH[2]}
fi

# shellcheck source=deploy/cluster_lib.sh
. deploy/cluster_lib.sh
cluster_init local.sh "$logdir"
# With --tls: what the workers and ps_serve add to reach the shards.
tls_client=()
if [ "$tls" = 1 ]; then
  command -v openssl >/dev/null || { echo "local.sh: --tls needs openssl (apt-get install openssl)" >&2; exit 1; }
  pki="$logdir/pki"
  mkdir -p "$pki"
  (
    cd "$pki"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem \
      -days 30 -subj /CN=asyncps-local-ca
    openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr \
      -subj /CN=localhost
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n' >server.ext
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key \
      -CAcreateserial -out server.pem -days 30 -extfile server.ext
    umask 077
    openssl rand -hex 32 >token
  ) >"$logdir/pki.log" 2>&1 || { cat "$logdir/pki.log" >&2; echo "local.sh: --tls: openssl failed" >&2; exit 1; }
  # The servers' --tls_ca is for their own connections to each other
  # (replicas); clients are not asked for certificates.
  server_flags="--tls_cert=$pki/server.pem --tls_key=$pki/server.key --tls_ca=$pki/ca.pem --cluster_token_file=$pki/token $server_flags"
  tls_client=(--tls_ca="$pki/ca.pem" --cluster_token_file="$pki/token")
fi
# Where the workers (and ps_serve) find the shards.
find_shards=()
if [ "$replicas" -gt 1 ]; then
  etcd_bin=$(command -v etcd || true)
  [ -n "$etcd_bin" ] || { echo "local.sh: --replicas needs etcd (deploy/install_deps.sh installs etcd-server)" >&2; exit 1; }
  cluster_start_etcd "$etcd_bin" "${pki:-}"
  run_id="local-$$"
  etcd_flags=""
  if [ "$tls" = 1 ]; then
    # etcd serves TLS too and requires a client certificate: the server
    # certificate is also issued for clientAuth.
    etcd_flags="--etcd_ca=$pki/ca.pem --etcd_cert=$pki/server.pem --etcd_key=$pki/server.key"
  fi
  server_flags="--replicas=$replicas --etcd_endpoints=$etcd_endpoint --run_id=$run_id $etcd_flags $server_flags"
  # shellcheck disable=SC2206  # flags without spaces, split on purpose
  find_shards=(--etcd_endpoints="$etcd_endpoint" --run_id="$run_id" $etcd_flags)
fi
cluster_start_shards "$server_bin" "$shards" "$server_flags" "$replicas"
cluster_start_standbys "$server_bin" "$shards" "$server_flags" "$standbys"
[ "$replicas" -gt 1 ] || find_shards=(--servers="$servers")
if [ "$replicas" -gt 1 ]; then
  standing_by=""
  [ "$standbys" -gt 0 ] && standing_by=" + $standbys spare(s) standing by"
  echo "cluster: $shards shard(s) x $replicas replicas$standing_by (shard map in etcd at $etcd_endpoint, run $run_id); $workers worker(s); logs in $logdir"
else
  echo "cluster: $shards shard(s) at $servers; $workers worker(s); logs in $logdir"
fi
if [ "$tls" = 1 ]; then
  echo "cluster: TLS and a cluster token on every connection"
fi
# How to watch it from another terminal (psctl is built beside the others;
# a prebuilt ASYNCPS_BIN may lack it).
psctl_bin=$(find_bin "$bin" tools psctl)
[ -x "$psctl_bin" ] || psctl_bin=psctl
echo "cluster: watch it with $psctl_bin status ${find_shards[*]}${tls_client[*]:+ ${tls_client[*]}} --watch=2s"

if [ "$serve" = 1 ]; then
  rm -f "$logdir/serve.port" "$logdir/serve.http_port" "$logdir/trained"
  OPENBLAS_NUM_THREADS=1 "$serve_bin" "${find_shards[@]}" "${tls_client[@]}" --host=127.0.0.1 \
    --port=0 --port_file="$logdir/serve.port" --http_port=0 \
    --http_port_file="$logdir/serve.http_port" --refresh_s=1 \
    >"$logdir/serve.log" 2>&1 &
  cluster_track serve $!
fi

for ((w = 0; w < workers; w++)); do
  extra=""
  [ "$w" = "$straggler_id" ] && extra="--straggler_delay_ms=$straggler_ms"
  # One BLAS thread per worker: the workers already share the cores.
  # shellcheck disable=SC2086
  OPENBLAS_NUM_THREADS=1 "$worker_bin" "${find_shards[@]}" "${tls_client[@]}" --worker_id=$w \
    --num_workers=$workers "${model_flags[@]}" $worker_flags $extra \
    > >(tee "$logdir/worker$w.out" | grep --line-buffered -E "worker $w |eval epoch|eval step|^final|^test split") \
    2>"$logdir/worker$w.log" &
  cluster_track "worker$w" $! worker
done
if [ "$serve" = 1 ]; then
  # The client waits for ps_serve's port (written once the model exists),
  # classifies every 5 s while training, and once $logdir/trained appears
  # makes the final pass with a snapshot read after training ended.
  (
    for _ in $(seq 1200); do [ -s "$logdir/serve.port" ] && break; sleep 0.1; done
    [ -s "$logdir/serve.port" ] || { echo "ps_serve wrote no port" >&2; exit 1; }
    echo "serving: gRPC 127.0.0.1:$(cat "$logdir/serve.port"), REST http://127.0.0.1:$(cat "$logdir/serve.http_port")/v2/models/mlp"
    exec "$eval_bin" --target="127.0.0.1:$(cat "$logdir/serve.port")" \
      --every_s=5 --final_after="$logdir/trained"
  ) > >(tee "$logdir/serve_eval.out") 2>"$logdir/serve_eval.log" &
  eval_pid=$!
  cluster_track serve_eval "$eval_pid"
fi
cluster_wait_workers
if [ "$serve" = 1 ]; then
  touch "$logdir/trained"
  set +e
  wait "$eval_pid"
  rc=$?
  set -e
  [ "$rc" = 0 ] || cluster_fail serve_eval "$eval_pid" "$rc"
fi
cluster_report "$shards" "$workers worker(s)"
