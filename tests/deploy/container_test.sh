#!/usr/bin/env bash
# Container test for deploy/container/Containerfile, run as root:
#
#   tests/deploy/container_test.sh
#
# Not part of tests/run.sh: it installs Debian packages (podman, buildah,
# mmdebstrap, runc) when missing and builds the image, whose build stage
# compiles asyncps from scratch (minutes; give --cache DIR, default
# ~/.cache/bazel-disk when it exists, to reuse a Bazel disk cache).
#
# The base image (debian:bookworm-slim) cannot be pulled here, so the test
# makes it from Debian's packages: `mmdebstrap --variant=minbase bookworm`
# and `podman import` under the name the Containerfile uses. Then:
#   1. the image builds (deploy/container/build.sh, podman);
#   2. it runs as uid 10001, holds no compiler and no -dev package, and all
#      three binaries answer --version;
#   3. 2 shard containers and 2 worker containers (host network, loopback
#      only, identity from ASYNCPS_* variables and JOB_COMPLETION_INDEX as
#      in Kubernetes) train for one epoch; worker 0 reports a final test
#      accuracy >= 0.75; psctl in a container sees both shards up;
#   4. `podman stop` (SIGTERM through tini) stops the shards cleanly.
# Where the kernel cannot run containers, steps 2-4 are reported skipped
# with the reason, and the image is still built (buildah, chroot isolation)
# and its binaries run inside its root file system with chroot.
#
# Ends with `N passed, N failed, N skipped`; exits non-zero on any failure.
# Environment: KEEP=1 keeps the containers' logs folder.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1

passed=0
failed=0
skipped=0
check() {  # name, command...
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
skip() {
  echo "SKIP: $*"
  skipped=$((skipped + 1))
}
summary() {
  echo "$passed passed, $failed failed, $skipped skipped"
  [ "$failed" = 0 ]
}

[ "$(id -u)" = 0 ] || { echo "container_test: run as root" >&2; echo "0 passed, 1 failed, 0 skipped"; exit 1; }

base=docker.io/library/debian:bookworm-slim
image=localhost/asyncps:container-test
cache=${CACHE:-$HOME/.cache/bazel-disk}
tag=asyncps-ct-$$
tmp=$(mktemp -d -t asyncps-container.XXXXXX)
chmod 777 "$tmp"
names=()

cleanup() {
  for n in "${names[@]}"; do podman rm -f -t 2 "$n" >/dev/null 2>&1; done
  if [ "${KEEP:-0}" = 1 ]; then echo "logs kept in $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT

missing=()
for p in podman buildah mmdebstrap runc; do
  command -v "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null || { echo "container_test: cannot install ${missing[*]}" >&2; failed=1; summary; exit 1; }
fi

# 0. The base image, from Debian's packages.
if ! podman image exists "$base"; then
  echo "making $base with mmdebstrap ..."
  if mmdebstrap --variant=minbase --mode=root bookworm "$tmp/base.tar" \
       >"$tmp/mmdebstrap.log" 2>&1 &&
     podman import "$tmp/base.tar" "$base" >/dev/null; then
    rm -f "$tmp/base.tar"
  else
    tail -n 20 "$tmp/mmdebstrap.log"
    check "base image $base" false
    summary
    exit 1
  fi
fi

# Can this kernel run containers? podman's defaults first; then runc (crun
# refuses hybrid cgroup v1/v2 hierarchies) with limits this process may set
# (podman's default rlimits exceed what some VMs allow).
run_flags=()
global=()
probe_log="$tmp/probe.log"
if podman run --rm --network=host "$base" true >"$probe_log" 2>&1; then
  run_flags=()
elif podman --runtime runc run --rm --network=host \
       --ulimit nofile=4096:4096 --ulimit nproc=4096:4096 "$base" true \
       >>"$probe_log" 2>&1; then
  run_flags=(--ulimit nofile=4096:4096 --ulimit nproc=4096:4096)
  global=(--runtime runc)
else
  run_flags=none
fi
pod() { podman ${global[@]+"${global[@]}"} "$@"; }

cache_args=()
[ -d "$cache" ] && cache_args=(--cache "$cache")

if [ "${run_flags[*]}" = none ]; then
  reason=$(tail -n 1 "$probe_log")
  echo "ASYNCPS_SKIPPED: this kernel cannot run containers: $reason"
  # 1'. Build with buildah in chroot isolation, run the binaries by chroot.
  t0=$(date +%s)
  check "image builds (buildah, chroot isolation)" \
    deploy/container/build.sh --engine buildah --tag "$image" "${cache_args[@]}" \
      -- --isolation=chroot --pull-never
  echo "build: $(($(date +%s) - t0)) s"
  ctr=$(buildah from "$image" 2>/dev/null) && root=$(buildah mount "$ctr")
  for b in ps_server ps_worker psctl ps_serve ps_serve_eval; do
    check "$b --version inside the image (chroot)" \
      chroot --userspec=10001:10001 "$root" /usr/local/bin/$b --version
  done
  [ -n "${ctr:-}" ] && { buildah umount "$ctr"; buildah rm "$ctr"; } >/dev/null 2>&1
  for s in "image runs as uid 10001" "no compiler or -dev packages" \
           "2 shards + 2 workers train in containers" "SIGTERM stops shards"; do
    skip "$s ($reason)"
  done
  summary
  exit $?
fi

# 1. The image.
t0=$(date +%s)
build_flags=(--pull=never --network=host ${global[@]+"${global[@]}"} "${run_flags[@]}")
check "image builds (podman)" \
  deploy/container/build.sh --engine podman --tag "$image" "${cache_args[@]}" \
    -- "${build_flags[@]}"
echo "build: $(($(date +%s) - t0)) s"
podman image exists "$image" || { summary; exit 1; }

# 2. What is in it.
in_image() { pod run --rm --network=host "${run_flags[@]}" "$image" "$@"; }
check "runs as uid 10001 (asyncps)" test "$(in_image id -u)" = 10001
check "no compiler, bazel or -dev package in the final stage" \
  test "$(in_image sh -c 'command -v gcc cc c++ bazel; dpkg -l | grep -c -- "-dev[: ]"' | tr -d '\n')" = 0
for b in ps_server ps_worker psctl ps_serve ps_serve_eval; do
  check "$b --version in the image" test -n "$(in_image $b --version)"
done

# 3. A short training: 2 shards, 2 workers, host network on loopback.
start() {  # name, then podman run arguments
  local name=$1
  shift
  names+=("$name")
  pod run -d --name "$name" --network=host "${run_flags[@]}" \
    --volume "$tmp:/run/asyncps" "$@" >/dev/null
}
for i in 0 1; do
  start "$tag-shard-$i" --hostname "asyncps-shard-$i" \
    -e ASYNCPS_SHARD_INDEX=auto -e ASYNCPS_NUM_SHARDS=2 \
    -e ASYNCPS_HOST=127.0.0.1 -e ASYNCPS_PORT=0 \
    -e ASYNCPS_PORT_FILE=/run/asyncps/shard$i.port \
    "$image" ps_server
done
servers=""
for i in 0 1; do
  for _ in $(seq 300); do [ -s "$tmp/shard$i.port" ] && break; sleep 0.1; done
  [ -s "$tmp/shard$i.port" ] || { pod logs "$tag-shard-$i" | tail -5; check "shard $i starts" false; summary; exit 1; }
  servers="${servers:+$servers,}127.0.0.1:$(head -n 1 "$tmp/shard$i.port")"
done
check "shards take their index from the pod-like host name" \
  sh -c "podman logs $tag-shard-1 2>&1 | grep -q 'shard 1/2 serving'"
for w in 0 1; do
  start "$tag-worker-$w" -e ASYNCPS_SERVERS="$servers" \
    -e ASYNCPS_WORKER_ID=auto -e JOB_COMPLETION_INDEX=$w \
    -e ASYNCPS_NUM_WORKERS=2 -e ASYNCPS_EPOCHS=1 -e OPENBLAS_NUM_THREADS=1 \
    "$image" ps_worker
done
codes=""
for w in 0 1; do
  code=$(timeout 900 podman wait "$tag-worker-$w" 2>/dev/null || echo timeout)
  codes="$codes$code "
  pod logs "$tag-worker-$w" >"$tmp/worker$w.log" 2>&1
done
check "workers exit 0 (got: $codes)" test "$codes" = "0 0 "
acc=$(grep -h 'final test accuracy:' "$tmp/worker0.log" | tail -n 1 | awk '{print $4}')
echo "final test accuracy: ${acc:-none}"
check "final test accuracy >= 0.75" awk -v a="${acc:-0}" 'BEGIN { exit !(a >= 0.75) }'
psctl_sees_both() {
  in_image psctl status --servers="$servers" | grep -q 'cluster: 2/2 shards up'
}
check "psctl in a container sees 2/2 shards up" psctl_sees_both

# 4. SIGTERM through tini.
for i in 0 1; do
  podman stop -t 20 "$tag-shard-$i" >/dev/null 2>&1
  code=$(podman inspect -f '{{.State.ExitCode}}' "$tag-shard-$i" 2>/dev/null)
  pod logs "$tag-shard-$i" >"$tmp/shard$i.log" 2>&1
  check "shard $i stops cleanly on SIGTERM (exit $code)" \
    sh -c "[ '$code' = 0 ] && grep -q 'shard stopped' '$tmp/shard$i.log'"
done
summary
