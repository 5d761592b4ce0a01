#!/usr/bin/env bash
# hack/fuzz.sh [DURATION] runs every Go fuzz target for DURATION (default 20s) each. `go test` already runs
# their seed corpora; this explores beyond them.
set -euo pipefail
cd "$(dirname "$0")/.."
time=${1:-20s}
git grep -l '^func Fuzz' -- '*_test.go' | while read -r f; do
  pkg=./$(dirname "$f")
  for target in $(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' "$f"); do
    echo "== $pkg $target ($time)"
    go test -run '^$' -fuzz "^$target\$" -fuzztime "$time" "$pkg"
  done
done
