#!/usr/bin/env bash
# Strict schema validation of every Kubernetes manifest deploy/k8s renders
# (the plain layout, monitoring/, jobset/, serving/, jobset-serving/,
# replicated/, elastic/), offline:
#   1. each rendered object against the OpenAPI schema of its kind
#      (k8s_schemas/validate.mjs: types, enumerations, required fields, and
#      every field the schema does not define refused, as `kubectl apply
#      --validate=strict` does on a cluster);
#   2. the proof that unknown fields are found at every position: a field
#      injected into each object of each manifest, one at a time, is refused
#      there (and a key added to a free-form map such as labels is not);
#   3. mutated copies fail and name what is wrong: a misspelled field
#      (podManagmentPolicy), a bad enumeration value (completionMode:
#      Indexd), and in the JobSet a misspelled field of its own
#      (sucessPolicy) and one inside a replicated job's Job template.
# Prints `ASYNCPS_SKIPPED: ...` and exits 0 when kubectl, python3-yaml, node
# or the schema packages are missing (deploy/install_deps.sh installs them).
set -uo pipefail
runfiles=${TEST_SRCDIR:-$0.runfiles}/asyncps
tmp=${TEST_TMPDIR:-$(mktemp -d)}
schemas=${ASYNCPS_K8S_SCHEMAS:-/usr/local/lib/asyncps/k8s-schemas}
validate="$runfiles/tests/deploy/k8s_schemas/validate.mjs"

command -v kubectl >/dev/null 2>&1 || { echo "ASYNCPS_SKIPPED: kubectl not installed"; exit 0; }
python3 -c 'import yaml' 2>/dev/null || { echo "ASYNCPS_SKIPPED: python3-yaml not installed"; exit 0; }
command -v node >/dev/null 2>&1 || { echo "ASYNCPS_SKIPPED: node not installed"; exit 0; }
[ -d "$schemas/node_modules/kubernetes-models" ] ||
  { echo "ASYNCPS_SKIPPED: no schema packages in $schemas (deploy/install_deps.sh)"; exit 0; }
echo "$(kubectl version --client 2>/dev/null | head -n 1); node $(node --version)"

failed=0
fail() { echo "FAIL: $*"; failed=1; }

# YAML documents -> one JSON array (what validate.mjs reads).
to_json() {
  python3 -c 'import json, sys, yaml
json.dump([d for d in yaml.safe_load_all(open(sys.argv[1])) if d], open(sys.argv[2], "w"))' "$1" "$2"
}

# validate NAME: checks $tmp/NAME.yaml (with the injection proof).
validate() {
  to_json "$tmp/$1.yaml" "$tmp/$1.json" || { fail "$1: not YAML"; return; }
  VALIDATE_INJECT=1 node "$validate" --modules "$schemas" "$tmp/$1.json" >"$tmp/$1.out" 2>&1
  local rc=$?
  sed "s|^|$1: |" "$tmp/$1.out"
  [ "$rc" = 0 ] || fail "$1 is not valid against its schemas (exit $rc)"
}

# mutant NAME SED_EXPR EXPECTED: a copy of NAME edited by SED_EXPR must
# fail validation with a line containing EXPECTED.
mutant() {
  local name=$1 expr=$2 expected=$3
  sed "$expr" "$tmp/$name.yaml" >"$tmp/mutant.yaml"
  cmp -s "$tmp/$name.yaml" "$tmp/mutant.yaml" && { fail "mutation '$expr' changed nothing in $name"; return; }
  to_json "$tmp/mutant.yaml" "$tmp/mutant.json"
  if node "$validate" --modules "$schemas" "$tmp/mutant.json" >"$tmp/mutant.out" 2>&1; then
    fail "$name with '$expr' passes validation"
  elif grep -qF -- "$expected" "$tmp/mutant.out"; then
    echo "mutant $name '$expr' refused: $(grep -F -m1 -- "$expected" "$tmp/mutant.out")"
  else
    cat "$tmp/mutant.out"
    fail "$name with '$expr' fails without naming $expected"
  fi
}

# kustomize does not follow the runfiles' symlinks: render a real copy.
rm -rf "$tmp/k8s"
cp -rL "$runfiles/deploy/k8s" "$tmp/k8s"
# kubectl 1.20's kustomize v2 has no replacements, which the JobSet
# layouts need (README: kubectl >= 1.21).
kustomize_lacks_replacements() {
  ! kubectl kustomize "$tmp/k8s/jobset" >/dev/null 2>"$tmp/v2.err" &&
    grep -q 'unknown field "replacements"' "$tmp/v2.err"
}
for layout in plain monitoring jobset serving jobset-serving replicated elastic; do
  dir="$tmp/k8s"
  [ "$layout" = plain ] || dir="$tmp/k8s/$layout"
  if kubectl kustomize "$dir" >"$tmp/$layout.yaml" 2>"$tmp/kustomize.err"; then
    validate "$layout"
  elif [[ "$layout" = jobset* ]] && kustomize_lacks_replacements; then
    # kubectl 1.20's kustomize v2 has no replacements (README: the JobSet
    # layouts need kubectl >= 1.21). Said, not hidden.
    echo "$layout: NOT CHECKED: this kubectl has no kustomize replacements"
  else
    cat "$tmp/kustomize.err"
    fail "kubectl kustomize $layout"
  fi
done

mutant plain 's/podManagementPolicy:/podManagmentPolicy:/' \
  '/spec/podManagmentPolicy: unknown field'
mutant plain 's/completionMode: Indexed/completionMode: Indexd/' \
  '/spec/completionMode: must be equal to one of the allowed values'
if [ -s "$tmp/jobset.yaml" ]; then
  mutant jobset 's/^  successPolicy:/  sucessPolicy:/' \
    'must NOT have additional properties "sucessPolicy"'
  mutant jobset 's/backoffLimitPerIndex:/backoffLimitPerIndx:/' \
    '/template/spec/backoffLimitPerIndx: unknown field'
fi

[ "$failed" = 0 ] && echo "k8s schemas: all checks passed"
exit "$failed"
