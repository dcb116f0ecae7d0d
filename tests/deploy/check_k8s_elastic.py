#!/usr/bin/env python3
"""Offline checks of deploy/k8s/elastic (the shard count changed live).

  check_k8s_elastic.py RENDERED.yaml SERVER_HELP PSCTL_HELP

RENDERED.yaml is `kubectl kustomize deploy/k8s/elastic`; SERVER_HELP and
PSCTL_HELP are `ps_server --help` and `psctl --help`. Checks that the
StatefulSet makes and removes pods one at a time (OrderedReady), starts the
slots on as many pods as it runs (ASYNCPS_SERVING_SHARDS = replicas), gives
a leaving pod time to drain, and that its preStop hook drains exactly that
pod: the hook's command is run with a stand-in psctl on PATH (which fails
once, to see it tried again) for pod asyncps-shard-3, and must have asked
`psctl scale --shards=3` of the pods the shards are. The scaler Deployment
runs `psctl scale --watch` on the same shard list, one at a time, and the
shards' NetworkPolicy admits it. Every ASYNCPS_* variable names a flag of
the binary it reaches. Prints one line per problem; exits 1 if any.
"""
import os
import subprocess
import sys
import tempfile

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_k8s_manifests as base  # noqa: E402

STUB = """#!/bin/sh
# A stand-in psctl: records its arguments, fails the first call.
echo "$*" >> "{calls}"
n=$(wc -l < "{calls}")
[ "$n" -ge 2 ]
"""


def one(docs, kind, name):
    found = [d for d in docs
             if d["kind"] == kind and d["metadata"]["name"] == name]
    if len(found) != 1:
        base.problem("expected one %s %s, found %d" % (kind, name, len(found)))
        return None
    return found[0]


def run_pre_stop(command, ordinal):
    """Runs the preStop command as pod asyncps-shard-<ordinal> would, with
    the stand-in psctl: the argument lines it was called with."""
    with tempfile.TemporaryDirectory() as d:
        calls = os.path.join(d, "calls")
        stub = os.path.join(d, "psctl")
        with open(stub, "w") as f:
            f.write(STUB.format(calls=calls))
        os.chmod(stub, 0o755)
        env = dict(os.environ, HOSTNAME="asyncps-shard-%d" % ordinal,
                   PATH=d + ":" + os.environ.get("PATH", ""))
        try:
            subprocess.run(command, env=env, timeout=30, check=True)
        except (subprocess.SubprocessError, OSError) as e:
            base.problem("the preStop hook failed: %s" % e)
            return []
        with open(calls) as f:
            return f.read().splitlines()


def check_shards(sts, configmaps, server_flags):
    """The StatefulSet; returns (its env, the shard DNS names)."""
    spec = sts["spec"]
    pod = spec["template"]["spec"]
    (ctr,) = pod["containers"]
    env = base.env_of(ctr, configmaps)
    base.check_flags(env, server_flags, "ps_server")
    if spec.get("podManagementPolicy") != "OrderedReady":
        base.problem("shard pods are not made and removed one at a time "
                     "(podManagementPolicy %r): leaving pods would drain "
                     "into each other" % spec.get("podManagementPolicy"))
    if int(pod.get("terminationGracePeriodSeconds", 30)) < 300:
        base.problem("a leaving pod has %ss to drain its slots" %
                     pod.get("terminationGracePeriodSeconds", 30))
    replicas = int(spec.get("replicas", 1))
    num_shards = int(env.get("ASYNCPS_NUM_SHARDS", 0))
    if int(env.get("ASYNCPS_NUM_SLOTS", 0)) <= 0:
        base.problem("the run is not slotted (ASYNCPS_NUM_SLOTS=%r)" %
                     env.get("ASYNCPS_NUM_SLOTS"))
    if str(env.get("ASYNCPS_SERVING_SHARDS")) != str(replicas):
        base.problem("the slots start on %r shards, the StatefulSet runs %d" %
                     (env.get("ASYNCPS_SERVING_SHARDS"), replicas))
    if not replicas <= num_shards:
        base.problem("%d pods, but the run may have %d shards" %
                     (replicas, num_shards))
    names = ["%s-%d.%s:%s" % (sts["metadata"]["name"], i, spec["serviceName"],
                              env.get("ASYNCPS_PORT"))
             for i in range(num_shards)]
    command = (ctr.get("lifecycle", {}).get("preStop", {})
               .get("exec", {}).get("command"))
    if not command:
        base.problem("leaving shard pods are not drained (no preStop exec)")
        return env, names
    calls = run_pre_stop(command, 3)
    if len(calls) != 2 or calls[0] != calls[1]:
        base.problem("the preStop hook called psctl %r (want the same scale "
                     "twice: the first one failed)" % calls)
        return env, names
    args = calls[0].split()
    servers = next((a.split("=", 1)[1] for a in args
                    if a.startswith("--servers=")), "").strip("'")
    derived = [servers.replace("{i}", str(i)) for i in range(num_shards)]
    if args[:1] != ["scale"] or "--shards=3" not in args or derived != names:
        base.problem("pod asyncps-shard-3's preStop ran psctl %s; want scale "
                     "--shards=3 of %s" % (calls[0], names))
    return env, names


def check_scaler(dep, configmaps, psctl_flags, shard_env, names, policies):
    spec = dep["spec"]
    pod = spec["template"]["spec"]
    (ctr,) = pod["containers"]
    if spec.get("replicas") != 1 or spec.get("strategy", {}).get("type") != "Recreate":
        base.problem("the scaler is not one pod at a time (replicas %r, "
                     "strategy %r)" % (spec.get("replicas"), spec.get("strategy")))
    if ctr.get("args") != ["psctl", "scale"]:
        base.problem("the scaler runs %r, not psctl scale" % ctr.get("args"))
    base.check_pod("scaler", pod, dict(ctr, args=["psctl"]), "psctl")
    env = base.env_of(ctr, configmaps)
    for e in ctr.get("env", []):
        ref = e.get("valueFrom", {}).get("configMapKeyRef")
        if ref:
            env[e["name"]] = configmaps.get(ref["name"], {}).get(
                "data", {}).get(ref["key"])
    base.check_flags(env, psctl_flags, "psctl")
    if not env.get("ASYNCPS_WATCH"):
        base.problem("the scaler does not watch (ASYNCPS_WATCH)")
    if env.get("ASYNCPS_NUM_SHARDS") != shard_env.get("ASYNCPS_NUM_SHARDS"):
        base.problem("the scaler lists %r shards, the shards %r" %
                     (env.get("ASYNCPS_NUM_SHARDS"),
                      shard_env.get("ASYNCPS_NUM_SHARDS")))
    derived = [env.get("ASYNCPS_SERVERS", "").replace("{i}", str(i))
               for i in range(len(names))]
    if derived != names:
        base.problem("the scaler would ask %r, the shards are %r" %
                     (derived, names))
    labels = spec["template"]["metadata"]["labels"]
    peers = [p.get("podSelector", {}).get("matchLabels", {})
             for d in policies for r in d["spec"].get("ingress", [])
             for p in r.get("from", [])]
    if not any(m and all(labels.get(k) == v for k, v in m.items())
               for m in peers):
        base.problem("the shards' NetworkPolicy does not admit the scaler")


def main(rendered, server_help, psctl_help):
    docs = [d for d in yaml.safe_load_all(open(rendered)) if d]
    configmaps = {d["metadata"]["name"]: d for d in docs
                  if d["kind"] == "ConfigMap"}
    sts = one(docs, "StatefulSet", "asyncps-shard")
    dep = one(docs, "Deployment", "asyncps-scaler")
    if sts is None or dep is None:
        return 1
    shard_env, names = check_shards(sts, configmaps,
                                    base.flags_of(server_help))
    check_scaler(dep, configmaps, base.flags_of(psctl_help), shard_env, names,
                 [d for d in docs if d["kind"] == "NetworkPolicy"])
    print("elastic: up to %d shard(s) at %s; %s at the start" %
          (len(names), ",".join(names[:2]) + ",...",
           shard_env.get("ASYNCPS_SERVING_SHARDS")))
    return 1 if base.problems else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
