#!/usr/bin/env python3
"""Offline consistency checks of the rendered Kubernetes manifests.

  check_k8s_manifests.py RENDERED.yaml SERVER_HELP WORKER_HELP OUTDIR
  check_k8s_manifests.py --jobset RENDERED.yaml SERVER_HELP WORKER_HELP
  check_k8s_manifests.py --serving RENDERED.yaml SERVE_HELP BASE_RENDERED.yaml
  check_k8s_manifests.py --jobset-serving RENDERED.yaml SERVE_HELP
  check_k8s_manifests.py --replicated RENDERED.yaml SERVER_HELP WORKER_HELP \
      PSCTL_HELP OUTDIR

RENDERED.yaml is `kubectl kustomize deploy/k8s`; SERVER_HELP and WORKER_HELP
are `ps_server --help` and `ps_worker --help`. Checks what a cluster would
only show at run time: every ASYNCPS_* variable names a flag of the binary
it reaches, probes and scrape annotations point at the ports the shard is
told to use, the shard count, server list and worker count agree, the
Services select the pods. Writes OUTDIR/shard-<i>.env and
OUTDIR/worker-<i>.env: the ASYNCPS_* environment a pod gets (ConfigMap and
container env, $(VAR) references expanded, HOSTNAME and
JOB_COMPLETION_INDEX as Kubernetes sets them), one NAME=value per line.
--replicated checks deploy/k8s/replicated (etcd, one StatefulSet per shard
group, anti-affinity, a disruption budget per group, clients through etcd)
and writes OUTDIR/shard-<s>-<r>.env (replica r of shard s, on node
node-<r>) and OUTDIR/worker-<i>.env.
Prints one line per problem; exits 1 if there is any.
"""
import re
import sys

import yaml

problems = []


def problem(msg):
    problems.append(msg)
    print("PROBLEM: " + msg)


def flags_of(help_path):
    flags = set()
    with open(help_path) as f:
        for line in f:
            m = re.match(r"^  --([a-z0-9_]+)=", line)
            if m:
                flags.add(m.group(1))
    return flags


def check_pod(what, pod, ctr, binary):
    """What both pod templates must have (Pod Security "restricted", the
    image's entrypoint, Guaranteed resources)."""
    if ctr.get("command"):
        problem("%s container sets command %r, replacing the image's "
                "entrypoint (tini): use args" % (what, ctr["command"]))
    if ctr.get("args") != [binary]:
        problem("%s container runs %r, not %s" % (what, ctr.get("args"), binary))
    sc = pod.get("securityContext", {})
    if sc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        problem("%s pods have no seccompProfile RuntimeDefault" % what)
    if pod.get("automountServiceAccountToken") is not False:
        problem("%s pods mount a service account token" % what)
    if pod.get("enableServiceLinks") is not False:
        problem("%s pods get Service link variables (ASYNCPS_* clashes)" % what)
    csc = ctr.get("securityContext", {})
    if csc.get("allowPrivilegeEscalation") is not False or \
            csc.get("capabilities", {}).get("drop") != ["ALL"]:
        problem("%s container may escalate or keeps capabilities" % what)
    res = ctr.get("resources", {})
    if not res.get("limits") or res.get("limits") != res.get("requests"):
        problem("%s resources: limits %r != requests %r (not Guaranteed)" %
                (what, res.get("limits"), res.get("requests")))


def check_worker_job(jspec):
    """The worker Job's retries by ps_worker's exit codes."""
    wpod = jspec["template"]["spec"]
    if wpod.get("restartPolicy") != "Never":
        problem("worker pods restart in place (restartPolicy %r): "
                "podFailurePolicy needs Never" % wpod.get("restartPolicy"))
    if not jspec.get("backoffLimitPerIndex"):
        problem("the worker Job has no backoffLimitPerIndex")
    rules = jspec.get("podFailurePolicy", {}).get("rules", [])
    if not any(r.get("action") == "FailJob" and
               r.get("onExitCodes", {}).get("operator") == "In" and
               2 in r["onExitCodes"].get("values", []) for r in rules):
        problem("exit code 2 (configuration) does not fail the Job at once")
    if not any(r.get("action") == "Ignore" and
               any(c.get("type") == "DisruptionTarget"
                   for c in r.get("onPodConditions", [])) for r in rules):
        problem("disruptions count as worker failures")
    if wpod.get("securityContext", {}).get("fsGroup") is None:
        problem("worker pods have no fsGroup (a 0440 token Secret is unreadable)")


def env_of(ctr, configmaps):
    """A container's variables: its envFrom ConfigMaps (which must exist),
    then its own values, $(VAR) references expanded (fieldRef variables
    stay as they are)."""
    env = {}
    for ref in ctr.get("envFrom", []):
        name = ref["configMapRef"]["name"]
        if name not in configmaps:
            problem("a container reads ConfigMap %s, which is not rendered" % name)
            continue
        env.update(configmaps[name]["data"])
    for e in ctr.get("env", []):
        if "value" in e:
            env[e["name"]] = re.sub(
                r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                lambda m: env.get(m.group(1), m.group(0)), e["value"])
        else:
            env[e["name"]] = "$(%s)" % e["name"]
    return env


def check_flags(env, flags, binary):
    for name in env:
        if name.startswith("ASYNCPS_") and env_var_flag(name) not in flags:
            problem("%s reaches %s, which has no flag --%s" %
                    (name, binary, env_var_flag(name)))


def load_with_jobset(rendered):
    """The rendered objects and their one JobSet (None, said, if not one)."""
    docs = [d for d in yaml.safe_load_all(open(rendered)) if d]
    jobsets = [d for d in docs if d["kind"] == "JobSet"]
    if len(jobsets) != 1:
        problem("expected one JobSet, found %d" % len(jobsets))
        return docs, None
    return docs, jobsets[0]


def main_jobset(rendered, server_help, worker_help):
    """deploy/k8s/jobset: one JobSet whose counts, run id and shard list
    come from one ConfigMap."""
    docs, js = load_with_jobset(rendered)
    if js is None:
        return 1
    if js["apiVersion"] != "jobset.x-k8s.io/v1alpha2":
        problem("JobSet apiVersion %s" % js["apiVersion"])
    configmaps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    claims = {d["metadata"]["name"] for d in docs
              if d["kind"] == "PersistentVolumeClaim"}
    spec = js["spec"]
    jobs = {r["name"]: r for r in spec["replicatedJobs"]}
    if set(jobs) != {"shard", "worker"}:
        problem("replicated jobs %s, want shard and worker" % sorted(jobs))
        return 1
    if not spec.get("network", {}).get("enableDNSHostnames"):
        problem("pods get no DNS names (network.enableDNSHostnames)")
    sp = spec.get("successPolicy", {})
    if sp.get("operator") != "All" or sp.get("targetReplicatedJobs") != ["worker"]:
        problem("the JobSet does not end when every worker has: %r" % sp)
    rules = spec.get("failurePolicy", {}).get("rules", [])
    if not any(r.get("action") == "FailJobSet" and
               "PodFailurePolicy" in r.get("onJobFailureReasons", []) and
               "worker" in r.get("targetReplicatedJobs", ["worker"])
               for r in rules):
        problem("a worker's configuration error (exit 2) does not fail the run")
    shard_job = jobs["shard"]["template"]["spec"]
    worker_job = jobs["worker"]["template"]["spec"]
    check_worker_job(worker_job)
    shard_pod = shard_job["template"]["spec"]
    worker_pod = worker_job["template"]["spec"]
    (sctr,) = shard_pod["containers"]
    (wctr,) = worker_pod["containers"]
    check_pod("shard", shard_pod, sctr, "ps_server")
    check_pod("worker", worker_pod, wctr, "ps_worker")
    for v in shard_pod.get("volumes", []):
        claim = v.get("persistentVolumeClaim", {}).get("claimName")
        if claim and claim not in claims:
            problem("shards mount claim %s, which is not rendered" % claim)
    senv = env_of(sctr, configmaps)
    wenv = env_of(wctr, configmaps)
    check_flags(senv, flags_of(server_help), "ps_server")
    check_flags(wenv, flags_of(worker_help), "ps_worker")
    # Counts written once: the Jobs and both processes agree.
    shards = shard_job.get("completions")
    workers = worker_job.get("completions")
    if shard_job.get("parallelism") != shards or shard_job.get("completionMode") != "Indexed":
        problem("the shard Job is not Indexed with parallelism = completions")
    if worker_job.get("parallelism") != workers or worker_job.get("completionMode") != "Indexed":
        problem("the worker Job is not Indexed with parallelism = completions")
    for who, env in (("shards", senv), ("workers", wenv)):
        if str(env.get("ASYNCPS_NUM_SHARDS")) != str(shards):
            problem("%s get ASYNCPS_NUM_SHARDS=%s, the shard Job runs %s" %
                    (who, env.get("ASYNCPS_NUM_SHARDS"), shards))
    if str(wenv.get("ASYNCPS_NUM_WORKERS")) != str(workers):
        problem("workers get ASYNCPS_NUM_WORKERS=%s, the worker Job runs %s" %
                (wenv.get("ASYNCPS_NUM_WORKERS"), workers))
    if senv.get("ASYNCPS_SHARD_INDEX") != "auto" or wenv.get("ASYNCPS_WORKER_ID") != "auto":
        problem("shards or workers do not take their index from the pod")
    # One run id: both processes and the instance label of every object.
    run = wenv.get("ASYNCPS_RUN_ID")
    if not run or senv.get("ASYNCPS_RUN_ID") != run:
        problem("run ids differ: shards %r, workers %r" %
                (senv.get("ASYNCPS_RUN_ID"), run))
    for what, meta in (("JobSet", js["metadata"]),
                       ("shard pods", shard_job["template"]["metadata"]),
                       ("worker pods", worker_job["template"]["metadata"])):
        if meta.get("labels", {}).get("app.kubernetes.io/instance") != run:
            problem("%s are not labelled with the run (instance=%r)" % (what, run))
    # The shard list the workers build is the shards' DNS names.
    name = js["metadata"]["name"]
    sub = spec.get("network", {}).get("subdomain") or name
    pattern = wenv.get("ASYNCPS_SERVERS", "").replace("$(JOBSET_NAME)", name)
    label = next((e["valueFrom"]["fieldRef"]["fieldPath"] for e in wctr["env"]
                  if e["name"] == "JOBSET_NAME"), "")
    if label != "metadata.labels['jobset.sigs.k8s.io/jobset-name']":
        problem("JOBSET_NAME is not the pod's jobset-name label: %r" % label)
    derived = [pattern.replace("{i}", str(i)) for i in range(int(shards or 0))]
    want = ["%s-shard-0-%d.%s:%s" % (name, i, sub, senv.get("ASYNCPS_PORT"))
            for i in range(int(shards or 0))]
    if derived != want or "{i}" not in pattern:
        problem("workers would dial %r, the shards are %r" % (derived, want))
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        port = sctr.get(probe, {}).get("grpc", {}).get("port")
        if str(port) != str(senv.get("ASYNCPS_HEALTH_PORT")):
            problem("shard %s dials %s, the health listener is on %s" %
                    (probe, port, senv.get("ASYNCPS_HEALTH_PORT")))
    print("jobset: %d shard(s) at %s, %d worker(s), run %s" %
          (int(shards or 0), ",".join(derived), int(workers or 0), run))
    return 1 if problems else 0


def check_serving(docs, serve_help, policy_docs, want):
    """ps_serve's Deployment in `docs` reads the shards at addresses `want`
    (host:port, shard order); its env names its flags; the NetworkPolicy of
    `policy_docs` admits it; probes, Service and autoscaler agree with it."""
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    for kind in ("Deployment", "Service", "HorizontalPodAutoscaler"):
        found = [d for d in by_kind.get(kind, [])
                 if d["metadata"]["name"].endswith("asyncps-serve")]
        if len(found) != 1:
            problem("expected one %s asyncps-serve, found %d" % (kind, len(found)))
        by_kind[kind] = found
    if problems:
        return 1
    dep = by_kind["Deployment"][0]
    svc = by_kind["Service"][0]
    hpa = by_kind["HorizontalPodAutoscaler"][0]
    pod = dep["spec"]["template"]["spec"]
    (ctr,) = pod["containers"]
    check_pod("serving", pod, ctr, "ps_serve")
    env = env_of(ctr, {})
    check_flags(env, flags_of(serve_help), "ps_serve")
    pattern = env.get("ASYNCPS_SERVERS", "")
    derived = [pattern.replace("{i}", str(i))
               for i in range(int(env.get("ASYNCPS_NUM_SHARDS", 0)))]
    if derived != want:
        problem("ps_serve would read %r, the shards are %r" % (derived, want))
    # The shards' NetworkPolicy admits pods of the deployment (part-of).
    policy_peers = [p.get("podSelector", {}).get("matchLabels", {})
                    for d in policy_docs if d["kind"] == "NetworkPolicy"
                    for r in d["spec"].get("ingress", []) for p in r.get("from", [])]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    if not any(m and all(labels.get(k) == v for k, v in m.items())
               for m in policy_peers):
        problem("the shards' NetworkPolicy does not admit the serving pods")
    for k, v in dep["spec"]["selector"]["matchLabels"].items():
        if labels.get(k) != v:
            problem("Deployment selector %s=%s does not match its pods" % (k, v))
    for k, v in svc["spec"]["selector"].items():
        if labels.get(k) != v:
            problem("Service selector %s=%s does not match the serving pods" % (k, v))
    ports = {p["name"]: p["containerPort"] for p in ctr["ports"]}
    if ports.get("grpc") != int(env.get("ASYNCPS_PORT", -1)) or \
            ports.get("http") != int(env.get("ASYNCPS_HTTP_PORT", -1)):
        problem("container ports %r differ from ASYNCPS_PORT / ASYNCPS_HTTP_PORT" % ports)
    for p in svc["spec"]["ports"]:
        if p.get("targetPort") not in ports:
            problem("Service port %s targets %r, not a container port" %
                    (p["name"], p.get("targetPort")))
    for probe, path in (("startupProbe", "/v2/health/ready"),
                        ("readinessProbe", "/v2/health/ready"),
                        ("livenessProbe", "/v2/health/live")):
        get = ctr.get(probe, {}).get("httpGet", {})
        if get.get("path") != path or get.get("port") not in ("http", ports.get("http")):
            problem("serving %s is %r, want GET %s on the http port" % (probe, get, path))
    ann = dep["spec"]["template"]["metadata"].get("annotations", {})
    if str(ann.get("prometheus.io/port")) != str(ports.get("http")):
        problem("prometheus.io/port %s is not the http port" % ann.get("prometheus.io/port"))
    ref = hpa["spec"]["scaleTargetRef"]
    if ref.get("kind") != "Deployment" or ref.get("name") != dep["metadata"]["name"]:
        problem("the autoscaler scales %r, not the serving Deployment" % ref)
    if not any(m.get("resource", {}).get("name") == "cpu"
               for m in hpa["spec"].get("metrics", [])):
        problem("the autoscaler does not scale on CPU")
    if not ctr.get("resources", {}).get("requests", {}).get("cpu"):
        problem("serving pods request no CPU (the autoscaler's utilization base)")
    print("serving: reads %s; gRPC %s, REST %s; %s..%s replicas" %
          (",".join(derived), ports.get("grpc"), ports.get("http"),
           hpa["spec"].get("minReplicas"), hpa["spec"].get("maxReplicas")))
    return 1 if problems else 0


def main_serving(rendered, serve_help, base_rendered):
    """deploy/k8s/serving: ps_serve reads the shards of the base deployment
    (its StatefulSet's pods through their Service)."""
    docs = [d for d in yaml.safe_load_all(open(rendered)) if d]
    base = [d for d in yaml.safe_load_all(open(base_rendered)) if d]
    (sts,) = [d for d in base if d["kind"] == "StatefulSet"]
    (shard_svc,) = [d for d in base if d["kind"] == "Service"]
    shard_port = next(p["port"] for p in shard_svc["spec"]["ports"]
                      if p["name"] == "grpc")
    want = ["%s-%d.%s:%d" % (sts["metadata"]["name"], i,
                             shard_svc["metadata"]["name"], shard_port)
            for i in range(sts["spec"]["replicas"])]
    return check_serving(docs, serve_help, base, want)


def main_jobset_serving(rendered, serve_help):
    """deploy/k8s/jobset-serving: ps_serve reads the shards of the JobSet
    rendered beside it (its name, its shard Job's count, the shards' port),
    as the JobSet's workers do."""
    docs, js = load_with_jobset(rendered)
    if js is None:
        return 1
    name = js["metadata"]["name"]
    sub = js["spec"].get("network", {}).get("subdomain") or name
    configmaps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    (shard,) = [r for r in js["spec"]["replicatedJobs"] if r["name"] == "shard"]
    shard_job = shard["template"]["spec"]
    (sctr,) = shard_job["template"]["spec"]["containers"]
    port = env_of(sctr, configmaps).get("ASYNCPS_PORT")
    want = ["%s-shard-0-%d.%s:%s" % (name, i, sub, port)
            for i in range(int(shard_job.get("completions") or 0))]
    return check_serving(docs, serve_help, docs, want)


def selects(match_labels, labels):
    """Whether a matchLabels selector (non-empty) selects pods with `labels`."""
    return bool(match_labels) and all(labels.get(k) == v
                                      for k, v in match_labels.items())


def resolved_env(ctr, configmaps, fields):
    """A container's variables as a pod gets them: envFrom ConfigMaps, then
    its env in order (configMapKeyRef values read, fieldRef values from
    `fields` by field path, $(VAR) references expanded)."""
    env = {}
    for ref in ctr.get("envFrom", []):
        name = ref.get("configMapRef", {}).get("name")
        if name not in configmaps:
            problem("a container reads ConfigMap %s, which is not rendered" % name)
            continue
        env.update(configmaps[name].get("data", {}))
    for e in ctr.get("env", []):
        if "value" in e:
            env[e["name"]] = re.sub(
                r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                lambda m: env.get(m.group(1), m.group(0)), e["value"])
            continue
        src = e.get("valueFrom", {})
        if "configMapKeyRef" in src:
            ref = src["configMapKeyRef"]
            data = configmaps.get(ref.get("name"), {}).get("data", {})
            if ref.get("key") not in data:
                problem("variable %s reads %r, not a key of a rendered ConfigMap" %
                        (e["name"], ref))
                continue
            env[e["name"]] = data[ref["key"]]
        elif "fieldRef" in src:
            path = src["fieldRef"]["fieldPath"]
            env[e["name"]] = fields.get(path, "<%s>" % path)
        else:
            problem("variable %s comes from %r, which this check cannot read" %
                    (e["name"], src))
    return env


def etcd_arg(args, name, default=None):
    for a in args:
        if a.startswith("--%s=" % name):
            return a.split("=", 1)[1]
    return default


def main_replicated(rendered, server_help, worker_help, psctl_help, outdir):
    """deploy/k8s/replicated: etcd, one StatefulSet per replicated shard
    group, clients through the shard map in etcd."""
    docs = [d for d in yaml.safe_load_all(open(rendered)) if d]
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    configmaps = {d["metadata"]["name"]: d for d in by_kind.get("ConfigMap", [])}
    server_flags = flags_of(server_help)
    worker_flags = flags_of(worker_help)
    psctl_flags = flags_of(psctl_help)
    if not server_flags or not worker_flags or not psctl_flags:
        problem("no flags found in the --help outputs")
        return 1
    for binary, flags in (("ps_server", server_flags), ("ps_worker", worker_flags),
                          ("psctl", psctl_flags)):
        for f in ("etcd_endpoints", "run_id"):
            if f not in flags:
                problem("%s has no --%s: it cannot find a replicated run" % (binary, f))
    if "replicas" not in server_flags:
        problem("ps_server has no --replicas")

    def pod_labels(obj):
        return obj["spec"]["template"]["metadata"].get("labels", {})

    statefulsets = by_kind.get("StatefulSet", [])
    etcd_sets = [s for s in statefulsets
                 if pod_labels(s).get("app.kubernetes.io/name") == "asyncps-etcd"]
    groups = [s for s in statefulsets if s not in etcd_sets]
    jobs = by_kind.get("Job", [])
    if len(etcd_sets) != 1 or not groups or len(jobs) != 1:
        problem("expected one etcd StatefulSet, shard group StatefulSets and one "
                "worker Job; found %d, %d, %d" % (len(etcd_sets), len(groups), len(jobs)))
        return 1
    (etcd,) = etcd_sets
    (job,) = jobs
    services = {d["metadata"]["name"]: d for d in by_kind.get("Service", [])}
    budgets = by_kind.get("PodDisruptionBudget", [])

    def check_service(sts, what):
        svc = services.get(sts["spec"].get("serviceName"))
        if svc is None:
            problem("%s: serviceName %r is not a rendered Service" %
                    (what, sts["spec"].get("serviceName")))
            return None
        if svc["spec"].get("clusterIP") != "None":
            problem("%s: Service %s is not headless" % (what, svc["metadata"]["name"]))
        if not svc["spec"].get("publishNotReadyAddresses"):
            problem("%s: Service %s publishes no names before the pods are ready"
                    % (what, svc["metadata"]["name"]))
        if not selects(svc["spec"].get("selector", {}), pod_labels(sts)):
            problem("%s: Service %s does not select its pods" %
                    (what, svc["metadata"]["name"]))
        if not selects(sts["spec"]["selector"].get("matchLabels", {}), pod_labels(sts)):
            problem("%s: the StatefulSet's selector does not match its pods" % what)
        return svc

    def required_anti_affinity(pod):
        terms = pod.get("affinity", {}).get("podAntiAffinity", {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution", [])
        return [t.get("labelSelector", {}).get("matchLabels", {}) for t in terms
                if t.get("topologyKey") == "kubernetes.io/hostname" and
                not t.get("labelSelector", {}).get("matchExpressions")]

    # Every pod template is matched by exactly one disruption budget (the
    # eviction API refuses pods under two).
    templates = [("etcd", etcd)] + [(g["metadata"]["name"], g) for g in groups]
    for what, sts in templates:
        matched = [b["metadata"]["name"] for b in budgets
                   if selects(b["spec"].get("selector", {}).get("matchLabels", {}),
                              pod_labels(sts))]
        if len(matched) != 1:
            problem("pods of %s are under %d disruption budgets %s, want one" %
                    (what, len(matched), matched))

    # etcd: members, their names and ports, elections, placement, quorum.
    esvc = check_service(etcd, "etcd")
    epod = etcd["spec"]["template"]["spec"]
    (ectr,) = epod["containers"]
    eargs = (ectr.get("command") or []) + (ectr.get("args") or [])
    members = etcd["spec"].get("replicas", 1)
    if members not in (1, 3, 5):
        problem("etcd has %d members: 1, 3 or 5" % members)
    if etcd["spec"].get("podManagementPolicy") != "Parallel" and members > 1:
        problem("etcd members start one by one: the first never becomes ready")
    eports = {p["name"]: p["containerPort"] for p in ectr.get("ports", [])}
    client_port, peer_port = eports.get("client"), eports.get("peer")
    ename = etcd["metadata"]["name"]
    sub = esvc["metadata"]["name"] if esvc else "?"
    member_hosts = ["%s-%d.%s" % (ename, i, sub) for i in range(members)]
    want_cluster = ",".join("%s-%d=http://%s:%s" % (ename, i, h, peer_port)
                            for i, h in enumerate(member_hosts))
    if etcd_arg(eargs, "initial-cluster") != want_cluster:
        problem("etcd --initial-cluster=%s, the members are %s" %
                (etcd_arg(eargs, "initial-cluster"), want_cluster))
    pod_name_var = next((e["name"] for e in ectr.get("env", [])
                         if e.get("valueFrom", {}).get("fieldRef", {}).get(
                             "fieldPath") == "metadata.name"), None)
    for arg, want in (("name", "$(%s)" % pod_name_var),
                      ("advertise-client-urls",
                       "http://$(%s).%s:%s" % (pod_name_var, sub, client_port)),
                      ("initial-advertise-peer-urls",
                       "http://$(%s).%s:%s" % (pod_name_var, sub, peer_port))):
        if etcd_arg(eargs, arg) != want:
            problem("etcd --%s=%s, want %s" % (arg, etcd_arg(eargs, arg), want))
    for arg, port in (("listen-client-urls", client_port),
                      ("listen-peer-urls", peer_port)):
        if not str(etcd_arg(eargs, arg, "")).endswith(":%s" % port):
            problem("etcd --%s=%s is not port %s" % (arg, etcd_arg(eargs, arg), port))
    if esvc:
        sports = {p["name"]: p["port"] for p in esvc["spec"]["ports"]}
        if sports.get("client") != client_port or sports.get("peer") != peer_port:
            problem("etcd Service ports %r, the members listen on %r" % (sports, eports))
    election_ms = int(etcd_arg(eargs, "election-timeout", 1000))
    heartbeat_ms = int(etcd_arg(eargs, "heartbeat-interval", 100))
    if election_ms < 5 * heartbeat_ms:
        problem("etcd's election timeout %d ms is under 5 heartbeats of %d ms" %
                (election_ms, heartbeat_ms))
    if members > 1 and not any(selects(m, pod_labels(etcd))
                               for m in required_anti_affinity(epod)):
        problem("etcd members may share a node (no required anti-affinity)")
    for b in budgets:
        if selects(b["spec"].get("selector", {}).get("matchLabels", {}),
                   pod_labels(etcd)) and members > 1:
            down = b["spec"].get("maxUnavailable")
            if down is None or members - int(down) < members // 2 + 1:
                problem("etcd's budget (maxUnavailable %r) does not keep a quorum "
                        "of %d members" % (down, members))
    # etcd's own image runs `command: etcd`; check_pod is for asyncps's.
    if epod.get("automountServiceAccountToken") is not False:
        problem("etcd pods mount a service account token")
    if not epod.get("securityContext", {}).get("runAsNonRoot"):
        problem("etcd pods may run as root")
    want_endpoints = ",".join("%s:%s" % (h, client_port) for h in member_hosts)
    service_endpoint = "%s:%s" % (sub, client_port)

    # The shard groups, and the sets of spares of any shard
    # (ASYNCPS_SHARD_INDEX=any): the same pod, less the group's placement.
    lease_ms = None
    run_ids = {}
    endpoints = {}
    indices = {}
    num_shards = None
    replicas_flag = None
    labels_of = {g["metadata"]["name"]: pod_labels(g) for g in groups}
    shard_envs = {}
    spare_sets = []
    for g in groups:
        gname = g["metadata"]["name"]
        pod = g["spec"]["template"]["spec"]
        (ctr,) = pod["containers"]
        spare = resolved_env(ctr, configmaps, {}).get("ASYNCPS_SHARD_INDEX") == "any"
        what = ("spares of any shard %s" if spare else "shard group %s") % gname
        svc = check_service(g, what)
        check_pod(what, pod, ctr, "ps_server")
        field_vars = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
                      for e in ctr.get("env", [])
                      if "fieldRef" in e.get("valueFrom", {})}
        env = resolved_env(ctr, configmaps, {"metadata.name": "$(POD_NAME)",
                                             "spec.nodeName": "$(NODE)"})
        check_flags(env, server_flags, "ps_server")
        r = g["spec"].get("replicas", 1)
        try:
            replicas_flag = int(env.get("ASYNCPS_REPLICAS", 1))
        except ValueError:
            replicas_flag = None
        idx = env.get("ASYNCPS_SHARD_INDEX", "0")
        if spare:
            # Any number of spares; they copy a live replica's state.
            if replicas_flag is None or replicas_flag < 2:
                problem("%s: ps_server --replicas=%s, a spare needs 2 or more" %
                        (what, env.get("ASYNCPS_REPLICAS", 1)))
        # More pods than R: the others stand by (server/replica_group.h).
        elif replicas_flag is None or r < replicas_flag:
            problem("%s runs %d pods, fewer than its ps_server --replicas=%s" %
                    (what, r, env.get("ASYNCPS_REPLICAS", 1)))
        if r < 2 and not spare:
            problem("%s has %d replica(s): not replicated" % (what, r))
        if spare:
            spare_sets.append(gname)
        elif not idx.isdigit():
            problem("%s: ASYNCPS_SHARD_INDEX=%s (auto would read the replica's "
                    "ordinal, not the shard)" % (what, idx))
        else:
            indices.setdefault(int(idx), []).append(gname)
        num_shards = env.get("ASYNCPS_NUM_SHARDS")
        run_ids[what] = env.get("ASYNCPS_RUN_ID")
        endpoints[what] = env.get("ASYNCPS_ETCD_ENDPOINTS")
        lease_ms = int(env.get("ASYNCPS_LEASE_MS", 1000))
        if field_vars.get("ASYNCPS_HOST_LABEL") != "spec.nodeName":
            problem("%s: ASYNCPS_HOST_LABEL is not the node's name (spec.nodeName)"
                    % what)
        if "ASYNCPS_HOST" in field_vars:
            problem("%s: ASYNCPS_HOST (the listen address) comes from %s" %
                    (what, field_vars["ASYNCPS_HOST"]))
        grpc_port = env.get("ASYNCPS_PORT")
        if svc is not None:
            want = "$(POD_NAME).%s:%s" % (svc["metadata"]["name"], grpc_port)
            if env.get("ASYNCPS_ADVERTISE_ADDRESS") != want:
                problem("%s advertises %s, its pods are reached at %s" %
                        (what, env.get("ASYNCPS_ADVERTISE_ADDRESS"), want))
            sports = {p["name"]: p["port"] for p in svc["spec"]["ports"]}
            if str(sports.get("grpc")) != str(grpc_port):
                problem("%s: Service port grpc %s != ASYNCPS_PORT %s" %
                        (what, sports.get("grpc"), grpc_port))
        ports = {p["name"]: p["containerPort"] for p in ctr.get("ports", [])}
        if str(ports.get("grpc")) != str(grpc_port):
            problem("%s: containerPort grpc %s != ASYNCPS_PORT %s" %
                    (what, ports.get("grpc"), grpc_port))
        # A replica is alive (asyncps.Process) before it serves: catching
        # up, restoring, or standing by for as long as its group is whole;
        # only readiness waits for the shard's service.
        for probe, service in (("startupProbe", "asyncps.Process"),
                               ("readinessProbe", "asyncps.ParameterServer"),
                               ("livenessProbe", "asyncps.Process")):
            port = ctr.get(probe, {}).get("grpc", {}).get("port")
            if port is None or str(port) != str(env.get("ASYNCPS_HEALTH_PORT")):
                problem("%s %s dials %s, the health listener is on %s" %
                        (what, probe, port, env.get("ASYNCPS_HEALTH_PORT")))
            asked = ctr.get(probe, {}).get("grpc", {}).get("service", "")
            if asked != service:
                problem("%s %s asks for %r, want %r" % (what, probe, asked,
                                                       service))
        ann = g["spec"]["template"]["metadata"].get("annotations", {})
        if str(ann.get("prometheus.io/port")) != str(env.get("ASYNCPS_METRICS_PORT")):
            problem("%s: prometheus.io/port %s != ASYNCPS_METRICS_PORT %s" %
                    (what, ann.get("prometheus.io/port"), env.get("ASYNCPS_METRICS_PORT")))
        mounts = {m["name"]: m["mountPath"] for m in ctr.get("volumeMounts", [])}
        claims = [c["metadata"]["name"] for c in g["spec"].get("volumeClaimTemplates", [])]
        if not any(mounts.get(c) == env.get("ASYNCPS_CHECKPOINT_DIR") for c in claims):
            problem("%s: ASYNCPS_CHECKPOINT_DIR=%r is not a mounted volume claim" %
                    (what, env.get("ASYNCPS_CHECKPOINT_DIR")))
        # Replicas on different nodes: a required anti-affinity whose
        # selector takes this group's pods and no other group's.
        own = [m for m in required_anti_affinity(pod) if selects(m, labels_of[gname])]
        if not own and not spare:
            problem("%s: no required pod anti-affinity on kubernetes.io/hostname "
                    "selecting its pods: two replicas may share a node" % what)
        for m in own:
            others = [o for o, l in labels_of.items() if o != gname and selects(m, l)]
            if others:
                problem("%s: its anti-affinity %r also selects the pods of %s" %
                        (what, m, others))
        # Its own disruption budget, one replica at a time.
        own_budgets = [b for b in budgets if selects(
            b["spec"].get("selector", {}).get("matchLabels", {}), labels_of[gname])]
        for b in own_budgets:
            sel = b["spec"]["selector"]["matchLabels"]
            others = [o for o, l in labels_of.items() if o != gname and selects(sel, l)]
            if others:
                problem("%s: budget %s also selects the pods of %s" %
                        (what, b["metadata"]["name"], others))
            if b["spec"].get("maxUnavailable") != 1:
                problem("%s: budget %s allows %r replicas away, want 1" %
                        (what, b["metadata"]["name"], b["spec"].get("maxUnavailable")))
        shard_envs[gname] = (env, r)
    for i, names in indices.items():
        if len(names) > 1:
            problem("shard %d is held by several groups: %s" % (i, names))
    if num_shards is None or sorted(indices) != list(range(int(num_shards))):
        problem("the groups hold shards %s, ASYNCPS_NUM_SHARDS=%s" %
                (sorted(indices), num_shards))
    if lease_ms is not None and lease_ms * 2 < 3 * election_ms:
        problem("ps_server's lease %d ms is under etcd's minimum lease TTL, 1.5 "
                "x its election timeout %d ms" % (lease_ms, election_ms))

    # The workers: through etcd, same run and shard count.
    jspec = job["spec"]
    wpod = jspec["template"]["spec"]
    (wctr,) = wpod["containers"]
    check_pod("worker", wpod, wctr, "ps_worker")
    check_worker_job(jspec)
    wenv = resolved_env(wctr, configmaps, {})
    check_flags(wenv, worker_flags, "ps_worker")
    if "ASYNCPS_SERVERS" in wenv:
        problem("workers get a fixed ASYNCPS_SERVERS: they would not follow "
                "failovers")
    run_ids["workers"] = wenv.get("ASYNCPS_RUN_ID")
    endpoints["workers"] = wenv.get("ASYNCPS_ETCD_ENDPOINTS")
    if wenv.get("ASYNCPS_NUM_SHARDS") != num_shards:
        problem("workers expect %s shards, the shards say %s" %
                (wenv.get("ASYNCPS_NUM_SHARDS"), num_shards))
    n = int(wenv.get("ASYNCPS_NUM_WORKERS", -1))
    if not (jspec.get("completionMode") == "Indexed" and
            jspec.get("completions") == jspec.get("parallelism") == n):
        problem("worker Job: Indexed %s, completions %s, parallelism %s, "
                "ASYNCPS_NUM_WORKERS %d" % (jspec.get("completionMode"),
                jspec.get("completions"), jspec.get("parallelism"), n))
    if wenv.get("ASYNCPS_WORKER_ID") != "auto":
        problem("workers do not take their id from JOB_COMPLETION_INDEX")

    # One run and one etcd everywhere.
    if len(set(run_ids.values())) != 1 or not next(iter(run_ids.values())):
        problem("run ids differ or are empty: %r" % run_ids)
    for who, ep in endpoints.items():
        if ep not in (want_endpoints, service_endpoint):
            problem("%s reach etcd at %r, its members are %s (Service %s)" %
                    (who, ep, want_endpoints, service_endpoint))

    # The network policy that selects the shards lets the shards (backups
    # and primaries dial each other) and the workers reach the gRPC port.
    for policy in by_kind.get("NetworkPolicy", []):
        sel = policy["spec"].get("podSelector", {}).get("matchLabels", {})
        for gname, labels in labels_of.items():
            if not selects(sel, labels):
                continue
            port = int(shard_envs[gname][0].get("ASYNCPS_PORT", 0))
            peers = [p.get("podSelector", {}).get("matchLabels", {})
                     for rule in policy["spec"].get("ingress", [])
                     if any(x.get("port") == port for x in rule.get("ports", []))
                     for p in rule.get("from", [])]
            for who, labels2 in (("the shards", labels), ("the workers",
                                 jspec["template"]["metadata"].get("labels", {}))):
                if not any(selects(m, labels2) for m in peers):
                    problem("NetworkPolicy %s keeps %s from port %d of %s" %
                            (policy["metadata"]["name"], who, port, gname))

    # The environment of replica r of each group (on node node-<r>: the
    # anti-affinity puts a group's replicas on different nodes) and of
    # worker i.
    def expand(value, env):
        return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                      lambda m: env.get(m.group(1), m.group(0)), value)

    for gname, (env, r) in shard_envs.items():
        g = next(x for x in groups if x["metadata"]["name"] == gname)
        (ctr,) = g["spec"]["template"]["spec"]["containers"]
        spare = gname in spare_sets
        for k in range(r):
            pod_name = "%s-%d" % (gname, k)
            node = ("spare-node-%d" if spare else "node-%d") % k
            penv = resolved_env(ctr, configmaps, {"metadata.name": pod_name,
                                                  "spec.nodeName": node})
            penv["HOSTNAME"] = pod_name
            penv = {name: expand(v, penv) for name, v in penv.items()}
            fname = ("spare-%d" % k if spare else
                     "shard-%s-%d" % (env.get("ASYNCPS_SHARD_INDEX"), k))
            with open("%s/%s.env" % (outdir, fname), "w") as f:
                for name, v in penv.items():
                    f.write("%s=%s\n" % (name, v))
    for i in range(max(n, 0)):
        with open("%s/worker-%d.env" % (outdir, i), "w") as f:
            for name, v in list(wenv.items()) + [("JOB_COMPLETION_INDEX", str(i))]:
                f.write("%s=%s\n" % (name, v))
    spares = sum(shard_envs[g][1] for g in spare_sets)
    print("replicated: %d shard group(s) x %s replicas and %d spare(s) of any shard "
          "(%s), etcd %d member(s) at "
          "%s, elections %d ms, leases %s ms, %d worker(s), run %s" %
          (len(groups) - len(spare_sets), replicas_flag, spares,
           ", ".join(sorted(labels_of)), members,
           endpoints.get("workers"), election_ms, lease_ms, n, run_ids.get("workers")))
    return 1 if problems else 0


def env_var_flag(name):
    return name[len("ASYNCPS_"):].lower()


def main():
    rendered, server_help, worker_help, outdir = sys.argv[1:5]
    docs = [d for d in yaml.safe_load_all(open(rendered)) if d]
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    for kind in ("Service", "StatefulSet", "Job", "ConfigMap"):
        if len(by_kind.get(kind, [])) != 1:
            problem("expected one %s, found %d" % (kind, len(by_kind.get(kind, []))))
    if problems:
        return 1
    svc = by_kind["Service"][0]
    sts = by_kind["StatefulSet"][0]
    job = by_kind["Job"][0]
    cm = by_kind["ConfigMap"][0]
    server_flags = flags_of(server_help)
    worker_flags = flags_of(worker_help)
    if not server_flags or not worker_flags:
        problem("no flags found in the --help outputs")
        return 1

    # Service <-> StatefulSet.
    if svc["spec"].get("clusterIP") != "None":
        problem("the shard Service is not headless (clusterIP: None)")
    if sts["spec"]["serviceName"] != svc["metadata"]["name"]:
        problem("StatefulSet serviceName %r != Service %r" %
                (sts["spec"]["serviceName"], svc["metadata"]["name"]))
    labels = sts["spec"]["template"]["metadata"]["labels"]
    for k, v in svc["spec"]["selector"].items():
        if labels.get(k) != v:
            problem("Service selector %s=%s does not match the shard pods" % (k, v))
    for k, v in sts["spec"]["selector"]["matchLabels"].items():
        if labels.get(k) != v:
            problem("StatefulSet selector %s=%s does not match its pods" % (k, v))

    # Shard container environment.
    pod = sts["spec"]["template"]["spec"]
    (ctr,) = pod["containers"]
    check_pod("shard", pod, ctr, "ps_server")
    cm_refs = [e["configMapRef"]["name"] for e in ctr.get("envFrom", [])]
    if cm["metadata"]["name"] not in cm_refs:
        problem("shards do not read the ConfigMap %s" % cm["metadata"]["name"])
    shard_env = dict(cm["data"])
    field_env = {}
    for e in ctr.get("env", []):
        if "value" in e:
            shard_env[e["name"]] = e["value"]
        else:
            field_env[e["name"]] = e["valueFrom"]["fieldRef"]["fieldPath"]
    for name in shard_env:
        if name.startswith("ASYNCPS_") and env_var_flag(name) not in server_flags:
            problem("%s reaches ps_server, which has no flag --%s" %
                    (name, env_var_flag(name)))
    replicas = sts["spec"]["replicas"]
    if int(shard_env.get("ASYNCPS_NUM_SHARDS", -1)) != replicas:
        problem("ASYNCPS_NUM_SHARDS=%s but the StatefulSet has %d replicas" %
                (shard_env.get("ASYNCPS_NUM_SHARDS"), replicas))
    if shard_env.get("ASYNCPS_SHARD_INDEX") != "auto":
        problem("shards do not take their index from the pod (ASYNCPS_SHARD_INDEX=auto)")
    ports = {p["name"]: p["containerPort"] for p in ctr["ports"]}
    grpc_port = int(shard_env.get("ASYNCPS_PORT", 0))
    health_port = int(shard_env.get("ASYNCPS_HEALTH_PORT", -1))
    metrics_port = int(shard_env.get("ASYNCPS_METRICS_PORT", -1))
    if ports.get("grpc") != grpc_port:
        problem("containerPort grpc %s != ASYNCPS_PORT %d" % (ports.get("grpc"), grpc_port))
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        p = ctr.get(probe, {}).get("grpc")
        if not p:
            problem("shard has no gRPC %s" % probe)
        elif p["port"] != health_port:
            problem("%s dials port %s, the health listener is on %d" %
                    (probe, p["port"], health_port))
    ann = sts["spec"]["template"]["metadata"].get("annotations", {})
    if ann.get("prometheus.io/scrape") != "true":
        problem("no prometheus.io/scrape annotation")
    if int(ann.get("prometheus.io/port", -2)) != metrics_port:
        problem("prometheus.io/port %s != ASYNCPS_METRICS_PORT %d" %
                (ann.get("prometheus.io/port"), metrics_port))
    if pod.get("terminationGracePeriodSeconds", 30) < 30:
        problem("terminationGracePeriodSeconds leaves no time for the final checkpoint")
    if not pod.get("securityContext", {}).get("runAsNonRoot"):
        problem("shard pods may run as root")
    mounts = {m["name"]: m["mountPath"] for m in ctr.get("volumeMounts", [])}
    claims = [c["metadata"]["name"] for c in sts["spec"].get("volumeClaimTemplates", [])]
    ckpt = shard_env.get("ASYNCPS_CHECKPOINT_DIR", "")
    if not any(mounts.get(c) == ckpt for c in claims):
        problem("ASYNCPS_CHECKPOINT_DIR=%r is not a mounted volume claim" % ckpt)
    svc_ports = {p["name"]: p["port"] for p in svc["spec"]["ports"]}
    if svc_ports.get("grpc") != grpc_port:
        problem("Service port grpc %s != %d" % (svc_ports.get("grpc"), grpc_port))

    # Disruption budget and network policy of the shards.
    for kind in ("PodDisruptionBudget", "NetworkPolicy"):
        objs = by_kind.get(kind, [])
        if len(objs) != 1:
            problem("expected one %s, found %d" % (kind, len(objs)))
            continue
        spec = objs[0]["spec"]
        sel = (spec.get("selector") or spec.get("podSelector") or {}).get(
            "matchLabels", {})
        if not sel or any(labels.get(k) != v for k, v in sel.items()):
            problem("the %s does not select the shard pods" % kind)
    for policy in by_kind.get("NetworkPolicy", []):
        allowed = {}
        for rule in policy["spec"].get("ingress", []):
            for port in rule.get("ports", []):
                allowed.setdefault(port["port"], []).extend(rule.get("from", []))
        part_of = labels.get("app.kubernetes.io/part-of")
        for port in (grpc_port, health_port):
            peers = allowed.get(port, [])
            if not any(p.get("podSelector", {}).get("matchLabels", {}).get(
                    "app.kubernetes.io/part-of") == part_of for p in peers):
                problem("the NetworkPolicy does not let this deployment's "
                        "pods reach port %d" % port)
        peers = allowed.get(metrics_port, [])
        if not peers or any("namespaceSelector" not in p for p in peers):
            problem("metrics port %d is not kept to the monitoring namespace"
                    % metrics_port)

    # Workers.
    jspec = job["spec"]
    if jspec.get("completionMode") != "Indexed":
        problem("the worker Job is not Indexed")
    wpod = jspec["template"]["spec"]
    (wctr,) = wpod["containers"]
    check_pod("worker", wpod, wctr, "ps_worker")
    check_worker_job(jspec)
    worker_env = {}
    for e in wctr.get("env", []):
        if "value" in e:
            worker_env[e["name"]] = e["value"]
            continue
        ref = e.get("valueFrom", {}).get("configMapKeyRef", {})
        if ref.get("name") != cm["metadata"]["name"] or ref.get("key") not in cm["data"]:
            problem("worker variable %s reads %r, not a key of ConfigMap %s" %
                    (e["name"], ref, cm["metadata"]["name"]))
            continue
        worker_env[e["name"]] = cm["data"][ref["key"]]
    for name in worker_env:
        if name.startswith("ASYNCPS_") and env_var_flag(name) not in worker_flags:
            problem("%s reaches ps_worker, which has no flag --%s" %
                    (name, env_var_flag(name)))
    n = int(worker_env.get("ASYNCPS_NUM_WORKERS", -1))
    if not (jspec.get("completions") == jspec.get("parallelism") == n):
        problem("completions %s, parallelism %s and ASYNCPS_NUM_WORKERS %d differ" %
                (jspec.get("completions"), jspec.get("parallelism"), n))
    if worker_env.get("ASYNCPS_WORKER_ID") != "auto":
        problem("workers do not take their id from JOB_COMPLETION_INDEX")
    # The shard list the workers derive ({i} over ASYNCPS_NUM_SHARDS) is the
    # shards' DNS names.
    want = ["%s-%d.%s:%d" % (sts["metadata"]["name"], i, svc["metadata"]["name"],
                             grpc_port) for i in range(replicas)]
    pattern = worker_env.get("ASYNCPS_SERVERS", "")
    derived = [pattern.replace("{i}", str(i))
               for i in range(int(worker_env.get("ASYNCPS_NUM_SHARDS", 0)))]
    if derived != want or "{i}" not in pattern:
        problem("workers would dial %r, the shards are %r" % (derived, want))
    if not wpod.get("securityContext", {}).get("runAsNonRoot"):
        problem("worker pods may run as root")

    # The environment of pod asyncps-shard-<i> and of worker pod <i>.
    def expand(value, env):
        return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                      lambda m: env.get(m.group(1), m.group(0)), value)

    for i in range(replicas):
        pod_name = "%s-%d" % (sts["metadata"]["name"], i)
        env = {"HOSTNAME": pod_name}
        for k, path in field_env.items():
            env[k] = pod_name if path == "metadata.name" else ""
        for k, v in shard_env.items():
            env[k] = expand(v, env)
        with open("%s/shard-%d.env" % (outdir, i), "w") as f:
            for k, v in env.items():
                f.write("%s=%s\n" % (k, v))
    for i in range(n):
        env = dict(worker_env)
        env["JOB_COMPLETION_INDEX"] = str(i)
        with open("%s/worker-%d.env" % (outdir, i), "w") as f:
            for k, v in env.items():
                f.write("%s=%s\n" % (k, v))
    return 1 if problems else 0


if __name__ == "__main__":
    if sys.argv[1] == "--jobset":
        sys.exit(main_jobset(*sys.argv[2:5]))
    if sys.argv[1] == "--serving":
        sys.exit(main_serving(*sys.argv[2:5]))
    if sys.argv[1] == "--jobset-serving":
        sys.exit(main_jobset_serving(*sys.argv[2:4]))
    if sys.argv[1] == "--replicated":
        sys.exit(main_replicated(*sys.argv[2:7]))
    sys.exit(main())
