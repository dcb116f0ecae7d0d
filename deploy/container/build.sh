#!/usr/bin/env bash
# Builds the asyncps container image from deploy/container/Containerfile.
#
#   deploy/container/build.sh          # tags asyncps:<version> and
#                                      # asyncps:<version>-g<revision>[.dirty]
#   deploy/container/build.sh --tag registry.example/asyncps:0.1.0
#   deploy/container/build.sh --cache ~/.cache/bazel-disk -- --pull=never
#
# Options:
#   --tag NAME       image name (default: asyncps:<version from
#                    common/version.h> and asyncps:<version>-g<git revision>,
#                    ".dirty" when the tree has uncommitted changes, so an
#                    image names the code it holds)
#   --base IMAGE     base image, e.g. pinned by digest
#                    (docker.io/library/debian@sha256:...)
#   --engine NAME    podman, buildah or docker (default: the first found)
#   --cache DIR      mount DIR as the build stage's Bazel disk cache
#   -- ARGS...       passed to the engine's build command as they are
#                    (e.g. --network=host, --runtime=runc, --ulimit ...)
# Exit status: the engine's; 2 for bad usage.
set -euo pipefail
cd "$(dirname "$0")/../.."

version=$(sed -n 's/.*kVersion\[\] = "\(.*\)";/\1/p' common/version.h)
version=${version:-dev}
revision=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
if [ "$revision" != unknown ] && ! git diff --quiet HEAD 2>/dev/null; then
  revision="$revision.dirty"
fi
tags=("asyncps:$version" "asyncps:$version-g$revision")
base=""
engine=""
cache=""
extra=()
usage() { sed -n '2,/^set /{/^#/p}' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) tags=("$2"); shift 2 ;;
    --base) base="$2"; shift 2 ;;
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
build_args=(--build-arg "VERSION=$version" --build-arg "REVISION=$revision")
[ -n "$base" ] && build_args+=(--build-arg "BASE=$base")
tag_args=()
for t in "${tags[@]}"; do tag_args+=(-t "$t"); done
echo "building ${tags[*]} with $engine ..."
exec "${cmd[@]}" -f deploy/container/Containerfile "${tag_args[@]}" \
  "${build_args[@]}" "${volume[@]}" "${extra[@]}" .
