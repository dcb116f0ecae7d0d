#!/usr/bin/env bash
# The Kubernetes manifests (deploy/k8s), without a cluster:
#   1. `kubectl kustomize` renders them;
#   2. kubectl decodes every workload into its typed API object offline
#      (`kubectl set env --local --list`: wrong field types fail);
#   3. check_k8s_manifests.py: every ASYNCPS_* variable names a flag of the
#      binary it reaches (from their --help), probes and scrape annotations
#      use the ports the shards are given, shard count, server list and
#      worker count agree, the Service selects the shard pods;
#   3b. deploy/k8s/jobset rendered and checked (check_k8s_manifests.py
#      --jobset): success and failure policies, counts and run id written
#      once and agreeing everywhere, the workers' derived shard list equal
#      to the shards' DNS names; a mutated copy (success policy Any) fails;
#   3c. deploy/k8s/serving rendered and checked (--serving): ps_serve
#      reads the shards of the base deployment, probes, Service and
#      autoscaler agree; a mutated copy (3 shards) fails;
#   3d. deploy/k8s/jobset-serving (--jobset-serving): the same ps_serve
#      reads the JobSet's shards; a mutated copy (3 shards) fails;
#   3e. deploy/k8s/replicated (--replicated): etcd members, one StatefulSet
#      per shard group whose pod count is at least ps_server's --replicas
#      (the pods beyond it stand by), a required
#      anti-affinity and a disruption budget selecting exactly each group,
#      spares of any shard (ASYNCPS_SHARD_INDEX=any) with a budget of their
#      own,
#      etcd endpoints and run id the same everywhere; mutated copies (a
#      group without anti-affinity, --replicas 3 of 2 pods) fail;
#   3f. deploy/k8s/elastic (check_k8s_elastic.py): pods made and removed
#      one at a time, the starting map on as many as run, a grace period
#      to drain, each leaving pod's preStop hook (run with a stand-in psctl)
#      draining exactly it, the scaler watching the same shards; mutated
#      copies (pods removed in parallel, a fixed drain count) fail;
#   4. the identity mapping, with the real binaries in the environment a pod
#      gets (HOSTNAME=asyncps-shard-<i>, JOB_COMPLETION_INDEX, ConfigMap and
#      container variables): shards 0 and 1 report their index and
#      advertised name, their health listener answers the probe, workers
#      with indices 0 and 3 appear under those ids, SIGTERM leaves a final
#      checkpoint. Only addresses are overridden (loopback, port 0).
#   5. the same for deploy/k8s/replicated, with a one-member etcd on
#      loopback: the four replica processes in their pods' environments form
#      two groups of a primary and a backup, each reporting its shard and
#      its node as host label, the spare of any shard stands by (psctl
#      status lists it), and a worker in its pod's environment trains
#      through the map (skipped, said, without etcd).
# Prints `ASYNCPS_SKIPPED: ...` and exits 0 when kubectl or python3-yaml is
# missing (deploy/install_deps.sh installs both).
set -uo pipefail
runfiles=${TEST_SRCDIR:-$0.runfiles}/asyncps
tmp=${TEST_TMPDIR:-$(mktemp -d)}
B=$runfiles

command -v kubectl >/dev/null 2>&1 || { echo "ASYNCPS_SKIPPED: kubectl not installed"; exit 0; }
python3 -c 'import yaml' 2>/dev/null || { echo "ASYNCPS_SKIPPED: python3-yaml not installed"; exit 0; }

failed=0
fail() { echo "FAIL: $*"; failed=1; }
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  wait 2>/dev/null
}
trap cleanup EXIT

kubectl version --client 2>/dev/null | head -n 1
# kustomize does not follow the runfiles' symlinks: render a real copy.
rm -rf "$tmp/k8s"
cp -rL "$runfiles/deploy/k8s" "$tmp/k8s"
# kubectl 1.20's kustomize v2 has no replacements, which the JobSet
# layouts need (README: kubectl >= 1.21).
kustomize_lacks_replacements() {
  ! kubectl kustomize "$tmp/k8s/jobset" >/dev/null 2>"$tmp/v2.err" &&
    grep -q 'unknown field "replacements"' "$tmp/v2.err"
}
if ! kubectl kustomize "$tmp/k8s" >"$tmp/rendered.yaml" 2>"$tmp/kustomize.err"; then
  cat "$tmp/kustomize.err"
  echo "FAIL: kubectl kustomize deploy/k8s"
  exit 1
fi
echo "rendered: $(grep -c '^kind:' "$tmp/rendered.yaml") objects"
# The workloads only: kubectl 1.20 cannot decode policy/v1 (its
# PodDisruptionBudget is policy/v1beta1), and `set env` reads pod templates.
python3 - "$tmp/rendered.yaml" "$tmp/workloads.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1]))
        if d and d["kind"] in ("StatefulSet", "Job", "Deployment")]
yaml.safe_dump_all(docs, open(sys.argv[2], "w"))
PY
kubectl set env --local --list -f "$tmp/workloads.yaml" >"$tmp/env.txt" 2>&1 ||
  { cat "$tmp/env.txt"; fail "kubectl decodes the workloads"; }

"$B/server/ps_server" --help >"$tmp/server.help" || fail "ps_server --help"
"$B/worker/ps_worker" --help >"$tmp/worker.help" || fail "ps_worker --help"
mkdir -p "$tmp/env"
python3 "$runfiles/tests/deploy/check_k8s_manifests.py" "$tmp/rendered.yaml" \
  "$tmp/server.help" "$tmp/worker.help" "$tmp/env" || fail "manifest checks"

# The PodMonitor (deploy/k8s/monitoring) scrapes the port the shards name
# "metrics", on the pods the shard StatefulSet makes.
if kubectl kustomize "$tmp/k8s/monitoring" >"$tmp/monitoring.yaml" 2>"$tmp/kustomize.err"; then
  python3 - "$tmp/monitoring.yaml" "$tmp/rendered.yaml" <<'PY' || fail "PodMonitor checks"
import sys, yaml
(pm,) = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
sts = [d for d in yaml.safe_load_all(open(sys.argv[2]))
       if d and d["kind"] == "StatefulSet"][0]
tpl = sts["spec"]["template"]
labels = tpl["metadata"]["labels"]
sel = pm["spec"]["selector"]["matchLabels"]
ports = {p["name"] for c in tpl["spec"]["containers"] for p in c["ports"]}
bad = []
if any(labels.get(k) != v for k, v in sel.items()):
    bad.append("the PodMonitor does not select the shard pods")
for e in pm["spec"]["podMetricsEndpoints"]:
    if e["port"] not in ports:
        bad.append("the PodMonitor scrapes port %r, the shards name %s" % (e["port"], sorted(ports)))
for b in bad:
    print("PROBLEM: " + b)
sys.exit(1 if bad else 0)
PY
else
  cat "$tmp/kustomize.err"
  fail "kubectl kustomize deploy/k8s/monitoring"
fi

# The JobSet variant (deploy/k8s/jobset): rendered, then its policies,
# counts, run id and derived shard list checked (a JobSet needs its CRD, so
# kubectl cannot decode it offline).
if kubectl kustomize "$tmp/k8s/jobset" >"$tmp/jobset.yaml" 2>"$tmp/kustomize.err"; then
  python3 "$runfiles/tests/deploy/check_k8s_manifests.py" --jobset \
    "$tmp/jobset.yaml" "$tmp/server.help" "$tmp/worker.help" ||
    fail "JobSet checks"
  # A mutated copy must fail: the workers no longer end the set.
  sed 's/^    operator: All$/    operator: Any/' "$tmp/jobset.yaml" >"$tmp/jobset-any.yaml"
  if python3 "$runfiles/tests/deploy/check_k8s_manifests.py" --jobset \
      "$tmp/jobset-any.yaml" "$tmp/server.help" "$tmp/worker.help" >/dev/null; then
    fail "a JobSet whose success policy is Any passes the checks"
  fi
elif grep -q 'unknown field "replacements"' "$tmp/kustomize.err"; then
  # Debian's kubectl 1.20 embeds kustomize v2, which has no replacements;
  # the JobSet needs kubectl >= 1.21 (README). Said, not hidden.
  echo "jobset: NOT CHECKED: $(kubectl version --client 2>/dev/null | head -n 1)" \
    "has no kustomize replacements"
else
  cat "$tmp/kustomize.err"
  fail "kubectl kustomize deploy/k8s/jobset"
fi

# Serving (deploy/k8s/serving): ps_serve reads the base deployment's shards,
# its env names its flags, probes, Service and autoscaler agree; the
# Deployment decodes offline. A mutated copy (one shard too many) fails.
if kubectl kustomize "$tmp/k8s/serving" >"$tmp/serving.yaml" 2>"$tmp/kustomize.err"; then
  "$B/serving/ps_serve" --help >"$tmp/serve.help" || fail "ps_serve --help"
  python3 "$runfiles/tests/deploy/check_k8s_manifests.py" --serving \
    "$tmp/serving.yaml" "$tmp/serve.help" "$tmp/rendered.yaml" ||
    fail "serving checks"
  python3 - "$tmp/serving.yaml" "$tmp/serving-workload.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "Deployment"]
yaml.safe_dump_all(docs, open(sys.argv[2], "w"))
PY
  kubectl set env --local --list -f "$tmp/serving-workload.yaml" >"$tmp/serve-env.txt" 2>&1 ||
    { cat "$tmp/serve-env.txt"; fail "kubectl decodes the serving Deployment"; }
  sed 's/^          value: "2"$/          value: "3"/' "$tmp/serving.yaml" >"$tmp/serving-3.yaml"
  if python3 "$runfiles/tests/deploy/check_k8s_manifests.py" --serving \
      "$tmp/serving-3.yaml" "$tmp/serve.help" "$tmp/rendered.yaml" >/dev/null; then
    fail "a serving Deployment reading 3 of 2 shards passes the checks"
  fi
else
  cat "$tmp/kustomize.err"
  fail "kubectl kustomize deploy/k8s/serving"
fi

# The JobSet with serving beside it (deploy/k8s/jobset-serving): ps_serve
# reads the JobSet's shards (its name and shard count, copied by
# replacements). A mutated copy (one shard too many) fails.
if kubectl kustomize "$tmp/k8s/jobset-serving" >"$tmp/jobset-serving.yaml" \
    2>"$tmp/kustomize.err"; then
  [ -s "$tmp/serve.help" ] || "$B/serving/ps_serve" --help >"$tmp/serve.help" ||
    fail "ps_serve --help"
  python3 "$runfiles/tests/deploy/check_k8s_manifests.py" --jobset-serving \
    "$tmp/jobset-serving.yaml" "$tmp/serve.help" || fail "JobSet serving checks"
  sed 's/^          value: "2"$/          value: "3"/' "$tmp/jobset-serving.yaml" \
    >"$tmp/jobset-serving-3.yaml"
  if python3 "$runfiles/tests/deploy/check_k8s_manifests.py" --jobset-serving \
      "$tmp/jobset-serving-3.yaml" "$tmp/serve.help" >/dev/null; then
    fail "a JobSet's serving Deployment reading 3 of 2 shards passes the checks"
  fi
elif kustomize_lacks_replacements; then
  # As for the JobSet: kustomize v2 (kubectl 1.20) cannot render it.
  echo "jobset-serving: NOT CHECKED: $(kubectl version --client 2>/dev/null | head -n 1)" \
    "has no kustomize replacements"
else
  cat "$tmp/kustomize.err"
  fail "kubectl kustomize deploy/k8s/jobset-serving"
fi
# Replicated shards (deploy/k8s/replicated): etcd, a StatefulSet per shard
# group, anti-affinity and budgets per group, clients through etcd. Its
# workloads decode offline. Mutated copies fail: a group whose replicas may
# share a node, and --replicas 3 for groups of 2 pods; groups of 3 pods
# with --replicas 2 (a standby each) pass.
"$B/tools/psctl" --help >"$tmp/psctl.help" || fail "psctl --help"
mkdir -p "$tmp/renv" "$tmp/mutant-env"
check_replicated() {
  python3 "$runfiles/tests/deploy/check_k8s_manifests.py" --replicated "$1" \
    "$tmp/server.help" "$tmp/worker.help" "$tmp/psctl.help" "$2"
}
if kubectl kustomize "$tmp/k8s/replicated" >"$tmp/replicated.yaml" 2>"$tmp/kustomize.err"; then
  check_replicated "$tmp/replicated.yaml" "$tmp/renv" || fail "replicated checks"
  python3 - "$tmp/replicated.yaml" "$tmp/replicated-workloads.yaml" \
    "$tmp/replicated-no-affinity.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
yaml.safe_dump_all([d for d in docs if d["kind"] in ("StatefulSet", "Job")],
                   open(sys.argv[2], "w"))
groups = [d for d in docs if d["kind"] == "StatefulSet" and
          d["metadata"]["name"].startswith("asyncps-shard-")]
del groups[-1]["spec"]["template"]["spec"]["affinity"]
yaml.safe_dump_all(docs, open(sys.argv[3], "w"))
PY
  kubectl set env --local --list -f "$tmp/replicated-workloads.yaml" \
    >"$tmp/renv.txt" 2>&1 ||
    { cat "$tmp/renv.txt"; fail "kubectl decodes the replicated workloads"; }
  if check_replicated "$tmp/replicated-no-affinity.yaml" "$tmp/mutant-env" >/dev/null; then
    fail "a shard group without pod anti-affinity passes the checks"
  fi
  sed 's/^  ASYNCPS_REPLICAS: "2"$/  ASYNCPS_REPLICAS: "3"/' "$tmp/replicated.yaml" \
    >"$tmp/replicated-r3.yaml"
  if cmp -s "$tmp/replicated.yaml" "$tmp/replicated-r3.yaml" ||
      check_replicated "$tmp/replicated-r3.yaml" "$tmp/mutant-env" >/dev/null; then
    fail "groups of 2 pods with --replicas=3 pass the checks"
  fi
  # Groups of 3 pods with --replicas=2: the third stands by.
  sed 's/^  replicas: 2$/  replicas: 3/' "$tmp/replicated.yaml" \
    >"$tmp/replicated-standby.yaml"
  if cmp -s "$tmp/replicated.yaml" "$tmp/replicated-standby.yaml" ||
      ! check_replicated "$tmp/replicated-standby.yaml" "$tmp/mutant-env" >/dev/null; then
    fail "groups of 3 pods with --replicas=2 (a standby each) fail the checks"
  fi
else
  cat "$tmp/kustomize.err"
  fail "kubectl kustomize deploy/k8s/replicated"
fi

# Elastic shards (deploy/k8s/elastic): pods one at a time, the slots on as
# many as run, each leaving pod's preStop drains exactly it (run with a
# stand-in psctl), the scaler watches the same shards. Its workloads decode
# offline. Mutated copies fail: pods removed in parallel, a preStop that
# drains into a fixed count.
check_elastic() {
  python3 "$runfiles/tests/deploy/check_k8s_elastic.py" "$1" \
    "$tmp/server.help" "$tmp/psctl.help"
}
if kubectl kustomize "$tmp/k8s/elastic" >"$tmp/elastic.yaml" 2>"$tmp/kustomize.err"; then
  check_elastic "$tmp/elastic.yaml" || fail "elastic checks"
  python3 - "$tmp/elastic.yaml" "$tmp/elastic-workloads.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
yaml.safe_dump_all([d for d in docs
                    if d["kind"] in ("StatefulSet", "Job", "Deployment")],
                   open(sys.argv[2], "w"))
PY
  kubectl set env --local --list -f "$tmp/elastic-workloads.yaml" \
    >"$tmp/eenv.txt" 2>&1 ||
    { cat "$tmp/eenv.txt"; fail "kubectl decodes the elastic workloads"; }
  sed 's/podManagementPolicy: OrderedReady/podManagementPolicy: Parallel/' \
    "$tmp/elastic.yaml" >"$tmp/elastic-parallel.yaml"
  if cmp -s "$tmp/elastic.yaml" "$tmp/elastic-parallel.yaml" ||
      check_elastic "$tmp/elastic-parallel.yaml" >/dev/null; then
    fail "shard pods removed in parallel pass the elastic checks"
  fi
  sed 's/--shards="${HOSTNAME##\*-}"/--shards=2/' "$tmp/elastic.yaml" \
    >"$tmp/elastic-fixed.yaml"
  if cmp -s "$tmp/elastic.yaml" "$tmp/elastic-fixed.yaml" ||
      check_elastic "$tmp/elastic-fixed.yaml" >/dev/null; then
    fail "a preStop that drains into a fixed count passes the elastic checks"
  fi
else
  cat "$tmp/kustomize.err"
  fail "kubectl kustomize deploy/k8s/elastic"
fi
[ "$failed" = 0 ] || exit 1

# Replaces the (sub)shell with binary $2 in the pod environment of file $1,
# plus the flags after; call it in a subshell or with &.
with_env() {
  local file=$1 bin=$2
  shift 2
  local vars=()
  while IFS= read -r line; do [ -n "$line" ] && vars+=("$line"); done <"$file"
  exec env "${vars[@]}" "$bin" "$@"
}

servers=""
for i in 0 1; do
  with_env "$tmp/env/shard-$i.env" "$B/server/ps_server" --host=127.0.0.1 \
    --port=0 --port_file="$tmp/shard$i.port" --health_port=0 \
    --health_port_file="$tmp/health$i.port" --metrics_port=-1 \
    --checkpoint_dir="$tmp/ckpt$i" >"$tmp/shard$i.log" 2>&1 &
  pids+=($!)
done
for i in 0 1; do
  for _ in $(seq 300); do [ -s "$tmp/shard$i.port" ] && break; sleep 0.1; done
  [ -s "$tmp/shard$i.port" ] || { cat "$tmp/shard$i.log"; fail "shard $i starts"; exit 1; }
  servers="${servers:+$servers,}127.0.0.1:$(head -n 1 "$tmp/shard$i.port")"
done

"$B/tools/psctl" status --servers="$servers" -o json >"$tmp/status.json" ||
  fail "psctl status (exit $?)"
python3 - "$tmp/status.json" <<'PY' || fail "shards report the pod identity"
import json, sys
doc = json.load(open(sys.argv[1]))
for i, s in enumerate(doc["shards"]):
    st = s["status"]
    assert st["shard_index"] == i, st
    assert st["num_shards"] == 2, st
    assert st["address"] == "asyncps-shard-%d.asyncps-shard:7000" % i, st
    assert st["policy"]["consistency"] == "SSP", st
print("shards: indices, num_shards, advertised names and policy as in the manifests")
PY
for i in 0 1; do
  "$B/tools/psctl" health --servers="127.0.0.1:$(head -n 1 "$tmp/health$i.port")" \
    --service=asyncps.ParameterServer | grep -q SERVING ||
    fail "the readiness probe's health listener of shard $i"
done

overrides=(--servers="$servers" --steps=2 --evaluate=false --hidden=16)
OPENBLAS_NUM_THREADS=1 with_env "$tmp/env/worker-3.env" "$B/worker/ps_worker" \
  "${overrides[@]}" >"$tmp/worker3.log" 2>&1 &
w3=$!
pids+=($w3)
(OPENBLAS_NUM_THREADS=1 with_env "$tmp/env/worker-0.env" \
  "$B/worker/ps_worker" "${overrides[@]}" >"$tmp/worker0.log" 2>&1) ||
  { tail -n 5 "$tmp/worker0.log"; fail "worker 0"; }
for _ in $(seq 1200); do kill -0 "$w3" 2>/dev/null || break; sleep 0.1; done
wait "$w3" || { tail -n 5 "$tmp/worker3.log"; fail "worker 3"; }
"$B/tools/psctl" status --servers="$servers" -o json >"$tmp/status2.json"
python3 - "$tmp/status2.json" <<'PY' || fail "workers take their ids from JOB_COMPLETION_INDEX"
import json, sys
ids = sorted(w["worker_id"] for w in json.load(open(sys.argv[1]))["workers"])
assert ids == [0, 3], ids
print("workers: ids", ids)
PY

for i in 0 1; do
  kill -TERM "${pids[$i]}"
  wait "${pids[$i]}"
  rc=$?
  [ "$rc" = 0 ] || fail "shard $i exits 0 on SIGTERM (got $rc)"
  [ -s "$tmp/ckpt$i/shard-$i-of-2.ckpt" ] || fail "shard $i wrote its final checkpoint"
done
# The replicated layout's identity with the real binaries: a one-member
# etcd (elections as in the manifest), the replica processes of both groups
# in their pods' environments (node-<r> as the node's name), addresses
# overridden to loopback (port 0, the bound port advertised) and etcd to the
# local one; the checkpoint directories exist, as the pods' volumes do.
if ! command -v etcd >/dev/null 2>&1; then
  echo "replicated processes: NOT CHECKED: etcd not installed"
else
  read -r eclient epeer < <(python3 -c 'import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
  etcd --name=k8s --data-dir="$tmp/etcd" \
    --listen-client-urls="http://127.0.0.1:$eclient" \
    --advertise-client-urls="http://127.0.0.1:$eclient" \
    --listen-peer-urls="http://127.0.0.1:$epeer" \
    --initial-advertise-peer-urls="http://127.0.0.1:$epeer" \
    --initial-cluster="k8s=http://127.0.0.1:$epeer" \
    --heartbeat-interval=50 --election-timeout=500 --log-level=warn \
    >"$tmp/etcd.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do
    (echo >"/dev/tcp/127.0.0.1/$eclient") 2>/dev/null && break
    sleep 0.1
  done
  etcd_at=127.0.0.1:$eclient
  for s in 0 1; do
    for r in 0 1; do
      mkdir -p "$tmp/rckpt-$s-$r"
      with_env "$tmp/renv/shard-$s-$r.env" "$B/server/ps_server" --host=127.0.0.1 \
        --port=0 --advertise_address= --etcd_endpoints="$etcd_at" \
        --port_file="$tmp/r$s-$r.port" --health_port=0 \
        --health_port_file="$tmp/rhealth$s-$r.port" --metrics_port=-1 \
        --checkpoint_dir="$tmp/rckpt-$s-$r" >"$tmp/r$s-$r.log" 2>&1 &
      pids+=($!)
    done
  done
  replicas=""
  for s in 0 1; do
    for r in 0 1; do
      for _ in $(seq 300); do [ -s "$tmp/r$s-$r.port" ] && break; sleep 0.1; done
      [ -s "$tmp/r$s-$r.port" ] ||
        { tail -n 5 "$tmp/r$s-$r.log"; fail "replica $r of shard $s starts"; exit 1; }
      replicas="$replicas 127.0.0.1:$(head -n 1 "$tmp/r$s-$r.port")"
    done
  done
  # The spare of any shard (shard-spares.yaml) stands by: both groups whole.
  mkdir -p "$tmp/rckpt-spare"
  with_env "$tmp/renv/spare-0.env" "$B/server/ps_server" --host=127.0.0.1 \
    --port=0 --advertise_address= --etcd_endpoints="$etcd_at" \
    --port_file="$tmp/rspare.port" --health_port=-1 --metrics_port=-1 \
    --checkpoint_dir="$tmp/rckpt-spare" >"$tmp/rspare.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 300); do grep -q "stands by" "$tmp/rspare.log" && break; sleep 0.1; done
  grep -q "stands by" "$tmp/rspare.log" ||
    { tail -n 5 "$tmp/rspare.log"; fail "the spare of any shard stands by"; }
  for a in $replicas; do
    "$B/tools/psctl" status --servers="$a" -o json
    echo
  done >"$tmp/replicas.json" || fail "psctl status of each replica"
  python3 - "$tmp/replicas.json" <<'PY' || fail "replicas report the pod identity"
import json, sys
seen = []
for line in open(sys.argv[1]):
    if not line.strip():
        continue
    (s,) = json.loads(line)["shards"]
    st = s["status"]
    seen.append((st["shard_index"], st["num_shards"], st["run_id"],
                 st["replica"]["replicas"], st["replica"]["host"],
                 st["replica"]["role"]))
want = [(i, 2, "asyncps-run-1", 2, "node-%d" % r) for i in (0, 1) for r in (0, 1)]
assert [x[:5] for x in seen] == want, seen
for i in (0, 1):
    assert sorted(x[5] for x in seen if x[0] == i) == ["backup", "primary"], seen
print("replicas: shard, run, R and node label as in the manifests; "
      "a primary and a backup per shard")
PY
  (OPENBLAS_NUM_THREADS=1 with_env "$tmp/renv/worker-0.env" "$B/worker/ps_worker" \
    --etcd_endpoints="$etcd_at" --steps=2 --evaluate=false --hidden=16 \
    >"$tmp/rworker0.log" 2>&1) ||
    { tail -n 5 "$tmp/rworker0.log"; fail "a worker finds the replicated shards in etcd"; }
  "$B/tools/psctl" status --etcd_endpoints="$etcd_at" --run_id=asyncps-run-1 -o json \
    >"$tmp/rstatus.json" || fail "psctl status through etcd (exit $?)"
  python3 - "$tmp/rstatus.json" <<'PY' || fail "the worker trained through the map"
import json, sys
doc = json.load(open(sys.argv[1]))
ids = [sorted(w["worker_id"] for w in s["status"]["workers"]) for s in doc["shards"]]
assert ids == [[0], [0]], ids
spares = [(x["host"], x["shard"]) for x in doc["standby_replicas"]]
assert spares == [("spare-node-0", "any")], spares
print("replicated worker: worker 0 on both primaries through the map; "
      "the spare of any shard stands by")
PY
fi

[ "$failed" = 0 ] && echo "k8s manifests: all checks passed"
exit "$failed"
