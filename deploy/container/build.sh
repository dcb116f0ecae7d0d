#!/usr/bin/env bash
# Builds the asyncps container image from deploy/container/Containerfile.
#
#   deploy/container/build.sh                      # tag asyncps:<version>
#   deploy/container/build.sh --tag registry.example/asyncps:0.1.0
#   deploy/container/build.sh --cache ~/.cache/bazel-disk -- --pull=never
#
# Options:
#   --tag NAME       image name (default asyncps:<version from common/version.h>)
#   --engine NAME    podman, buildah or docker (default: the first found)
#   --cache DIR      mount DIR as the build stage's Bazel disk cache
#   -- ARGS...       passed to the engine's build command as they are
#                    (e.g. --network=host, --runtime=runc, --ulimit ...)
# Exit status: the engine's; 2 for bad usage.
set -euo pipefail
cd "$(dirname "$0")/../.."

version=$(sed -n 's/.*kVersion\[\] = "\(.*\)";/\1/p' common/version.h)
tag="asyncps:${version:-dev}"
engine=""
cache=""
extra=()
usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) tag="$2"; shift 2 ;;
    --engine) engine="$2"; shift 2 ;;
    --cache) cache="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "build.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if [ -z "$engine" ]; then
  for e in podman buildah docker; do
    command -v "$e" >/dev/null 2>&1 && { engine=$e; break; }
  done
fi
[ -n "$engine" ] || { echo "build.sh: no podman, buildah or docker found" >&2; exit 2; }
volume=()
if [ -n "$cache" ]; then
  mkdir -p "$cache"
  volume=(--volume "$(cd "$cache" && pwd):/bazel-cache")
fi
case "$engine" in
  buildah) cmd=(buildah bud) ;;
  *) cmd=("$engine" build) ;;
esac
echo "building $tag with $engine ..."
exec "${cmd[@]}" -f deploy/container/Containerfile -t "$tag" \
  "${volume[@]}" "${extra[@]}" .
