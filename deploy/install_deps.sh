#!/usr/bin/env bash
# Installs the Debian 12 packages asyncps builds and runs with, if missing.
# Idempotent and quiet when everything is present. Needs root (or sudo).
#
#   deploy/install_deps.sh            # everything: build, tests, Python, tools
#   deploy/install_deps.sh --build    # only what building ps_server,
#                                     # ps_worker and psctl needs (the
#                                     # container image's build stage)
set -euo pipefail

build_only=0
case "${1:-}" in
  "") ;;
  --build) build_only=1 ;;
  *) echo "install_deps.sh: unknown option '$1' (--build or nothing)" >&2; exit 2 ;;
esac

# The three binaries.
packages=(
  bazel-bootstrap bazel-rules-java bazel-platforms
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev catch2 libopenblas-dev zlib1g-dev
  libcpp-httplib-dev pkgconf
)
if [ "$build_only" = 0 ]; then
  packages+=(
    # Tests, lint, the demo data and the manifest checks; etcd for the
    # membership tests.
    dataset-fashion-mnist clang clang-format openssl python3-yaml etcd-server
    # The REST tests of ps_serve send their requests with curl.
    curl
    # The plots of the studies (tests/bench).
    gnuplot-nox
    # Python package (python/): binding, numpy, PyTorch integration and tests.
    python3-dev pybind11-dev python3-numpy python3-torch python3-pytest
  )
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
# kubectl for the offline manifest checks (tests/deploy): Debian's
# kubernetes-client (8 MB download) unless some kubectl is already there
# (another package may own /usr/bin/kubectl).
# node and npm for the strict schema check of the manifests, unless some
# node is already there.
if [ "$build_only" = 0 ]; then
  command -v kubectl >/dev/null 2>&1 || missing+=(kubernetes-client)
  command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
fi

sudo=""
if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The OpenAPI schemas tests/deploy/k8s_schema_test checks the manifests
# against (npm packages, versions locked in tests/deploy/k8s_schemas), in
# one system folder; reinstalled only when the lock file changes.
if [ "$build_only" = 0 ]; then
  src="$(cd "$(dirname "$0")/../tests/deploy/k8s_schemas" && pwd)"
  dst=/usr/local/lib/asyncps/k8s-schemas
  if ! cmp -s "$src/package-lock.json" "$dst/package-lock.json" ||
      [ ! -d "$dst/node_modules/kubernetes-models" ]; then
    echo "installing: the Kubernetes schema packages into $dst"
    $sudo mkdir -p "$dst"
    $sudo cp "$src/package.json" "$src/package-lock.json" "$dst/"
    $sudo npm ci --prefix "$dst" --no-audit --no-fund --loglevel=error >/dev/null
  fi
fi
