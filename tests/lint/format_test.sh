#!/usr/bin/env bash
# Checks that every C++ file of the repository (the `sources` filegroups the
# BUILD file lists) is formatted as .clang-format says (Google style):
# `clang-format --dry-run -Werror`. Names each file that differs and fails.
# To format them all (from the repository root):
#   git ls-files '*.cc' '*.h' '*.cu' | xargs clang-format -i
set -euo pipefail
root="${TEST_SRCDIR:?}/${TEST_WORKSPACE:-asyncps}"
cd "$root"
clang_format=$(command -v clang-format || command -v clang-format-14 || true)
if [ -z "$clang_format" ]; then
  echo "clang-format not found (deploy/install_deps.sh installs it)" >&2
  exit 1
fi
[ -f .clang-format ] || { echo ".clang-format missing from the runfiles" >&2; exit 1; }
mapfile -t files < <(find -L . -path ./external -prune -o -type f \
  \( -name '*.cc' -o -name '*.h' -o -name '*.cu' \) -print | sed 's|^\./||' | sort)
# A missing filegroup must not pass as "nothing to check".
if [ "${#files[@]}" -lt 100 ]; then
  echo "only ${#files[@]} C++ files in the runfiles; expected the whole tree" >&2
  exit 1
fi
bad=()
for f in "${files[@]}"; do
  if ! "$clang_format" --style=file --dry-run -Werror "$f" >/dev/null 2>&1; then
    bad+=("$f")
  fi
done
for f in "${bad[@]}"; do echo "not formatted: $f"; done
echo "clang-format: ${#files[@]} files, ${#bad[@]} not formatted"
if [ "${#bad[@]}" -gt 0 ]; then
  echo "fix: git ls-files '*.cc' '*.h' '*.cu' | xargs clang-format -i"
  exit 1
fi
