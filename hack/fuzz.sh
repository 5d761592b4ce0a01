#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# hack/fuzz.sh [DURATION] runs every Go fuzz target in the repository for DURATION (default 20s) each, goes on
# after a failure, prints one line per target (package, target, executions, result) and exits non-zero when any
# target failed. `go test` already runs their seed corpora; this explores beyond them. Each package's fuzzing
# test binary is built once and run once per target (as `go test -fuzz` would: from the package directory, with
# go's fuzz cache), so a short DURATION is not dominated by linking. A crasher is written to the package's
# testdata/fuzz/<target>/; rerun it with `go test -run <target>/<file> <pkg>`.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
time=${1:-20s}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cache=$(go env GOCACHE)/fuzz
summary=()
failed=0
row() { summary+=("$(printf '%-22s %-24s %12s  %s' "$@")"); }
for dir in $(git grep -l '^func Fuzz' -- '*_test.go' | xargs -n1 dirname | sort -u); do
  pkg=./$dir
  targets=$(cat "$dir"/*_test.go | sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p')
  bin=$work/$(echo "$dir" | tr / _).test
  echo "== building $pkg"
  if ! go test -c -fuzz=. -o "$bin" "$pkg"; then
    for target in $targets; do
      row "$pkg" "$target" - "FAIL (build)"
      failed=$((failed + 1))
    done
    continue
  fi
  importpath=$(go list "$pkg")
  for target in $targets; do
    echo "== $pkg $target ($time)"
    log=$work/$target.log
    fuzz() {
      (cd "$root/$dir" && "$bin" -test.run='^$' -test.fuzz="^$target\$" -test.fuzztime="$time" \
        -test.fuzzcachedir="$cache/$importpath") 2>&1 | tee "$log"
    }
    # Go's fuzzer can fail a run whose time ran out while a worker was being stopped, with no input to blame (no
    # crasher written): such a run is tried again, up to five times in all (on a loaded two-core machine three of
    # seventeen targets met it in one run); any other failure counts at once.
    result=FAIL
    for try in 1 2 3 4 5; do
      if fuzz; then
        result=ok
        [ "$try" -gt 1 ] && result="ok (run $try times: go's end-of-time error before)"
        break
      fi
      grep -q 'context deadline exceeded' "$log" && ! grep -q 'Failing input written' "$log" || break
    done
    [ "$result" = FAIL ] && failed=$((failed + 1))
    # The last progress line says how many inputs ran: "fuzz: elapsed: 20s, execs: 123456 (...)". A target
    # whose last five reports ran nothing is stuck on an input (go's fuzzer has no per-input timeout): a hang.
    execs=$(grep -o 'execs: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
    if [ "$result" = ok ] && [ "$(grep -c '' <(grep 'execs:' "$log" | tail -5 | grep ' (0/sec)'))" -ge 5 ]; then
      result="FAIL (stalled: no executions in the last 5 reports, an input hangs)"
      failed=$((failed + 1))
    fi
    row "$pkg" "$target" "${execs:-?}" "$result"
  done
done
echo
printf '%-22s %-24s %12s  %s\n' package target execs result
printf '%s\n' "${summary[@]}"
if [ "$failed" -gt 0 ]; then
  echo "$failed fuzz target(s) failed" >&2
  exit 1
fi
