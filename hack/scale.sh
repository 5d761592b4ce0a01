#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# hack/scale.sh [N] — the scale harness (make scale N=1000): a private local control plane (real kube-apiserver +
# etcd on API_PORT 29443 / ETCD_PORT 29790, so it never meets the demo or the tests), the CRDs, N Node objects,
# the operator as a process, then hack/scale simulates N agents in one process, applies a TransferPool that
# selects every node and measures convergence, the operator's peak RSS and the API request rate.
# The last line is: converged N nodes in X s, operator RSS Y MiB, API Z req/s
# Extra flags for hack/scale run go in SCALE_FLAGS (e.g. "-window 60s -ramp 0"). SCALE_CPU_PROFILE=FILE saves the
# operator's CPU profile over the first SCALE_PROFILE_SECONDS (default 60) of the measured run. Everything it started is
# stopped on exit; the state directory is removed unless KEEP_STATE=1.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BIN=${BIN_DIR:-$ROOT/bin}
N=${1:-${N:-100}}
export API_PORT=${SCALE_API_PORT:-29443} ETCD_PORT=${SCALE_ETCD_PORT:-29790}
OPERATOR_PORT=${SCALE_OPERATOR_PORT:-29480} # below the ephemeral range, so no outgoing connection holds it
ST=$(mktemp -d /tmp/fabricxfer-scale.XXXXXX)

for b in kubectl kube-apiserver etcd; do
  [ -x "$BIN/$b" ] || { echo "scale: $BIN/$b missing: run make tools" >&2; exit 1; }
done

OPERATOR_PID=
cleanup() {
  if [ -n "$OPERATOR_PID" ]; then
    kill "$OPERATOR_PID" 2>/dev/null || true
    for _ in $(seq 1 40); do kill -0 "$OPERATOR_PID" 2>/dev/null || break; sleep 0.25; done
    kill -9 "$OPERATOR_PID" 2>/dev/null || true
  fi
  [ -d "$ST/kube" ] && BIN_DIR=$BIN KEEP_STATE=${KEEP_STATE:-0} hack/kube-down.sh "$ST/kube"
  [ "${KEEP_STATE:-0}" = 1 ] && echo "scale: state kept in $ST" >&2 || rm -rf "$ST"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

step() { printf '==> %s\n' "$*"; }
kc() { "$BIN/kubectl" --kubeconfig "$ST/kube/kubeconfig" "$@"; }

step "building operator and the scale harness"
go build -o "$ST/operator" ./cmd/operator
go build -o "$ST/scale" ./hack/scale

step "starting kube-apiserver + etcd on 127.0.0.1:$API_PORT"
# On a loaded machine etcd can start slower than kube-apiserver waits for it; a few more tries cover that.
for try in 1 2 3; do
  BIN_DIR=$BIN hack/kube-up.sh "$ST/kube" >/dev/null 2>"$ST/kube-up.err" && break
  echo "scale: control plane did not start (try $try of 3); etcd log tail:" >&2
  tail -3 "$ST/kube/etcd.log" >&2 || true
  BIN_DIR=$BIN hack/kube-down.sh "$ST/kube"
  [ "$try" -lt 3 ] || { tail -5 "$ST/kube-up.err" >&2; exit 1; }
done
export KUBECONFIG=$ST/kube/kubeconfig
kc apply -f config/crd/bases >/dev/null
kc wait --for=condition=Established --timeout=60s crd/transferpools.fabricxfer.io crd/transfernodes.fabricxfer.io crd/vpodtopologies.fabricxfer.io >/dev/null

step "creating $N Node objects"
"$ST/scale" nodes -n "$N"

step "starting the operator (agents' namespace fabricxfer-system)"
kc create namespace fabricxfer-system >/dev/null
"$ST/operator" --leader-elect=false --metrics-bind-address="127.0.0.1:$OPERATOR_PORT" \
  --health-probe-bind-address="127.0.0.1:$((OPERATOR_PORT + 1))" --pprof-bind-address="127.0.0.1:$((OPERATOR_PORT + 2))" \
  >"$ST/operator.log" 2>&1 &
OPERATOR_PID=$!
deadline=$(($(date +%s) + 60))
until curl -sf "http://127.0.0.1:$((OPERATOR_PORT + 1))/readyz" >/dev/null 2>&1; do
  kill -0 "$OPERATOR_PID" 2>/dev/null || { echo "scale: operator exited:" >&2; tail -20 "$ST/operator.log" >&2; exit 1; }
  [ "$(date +%s)" -lt "$deadline" ] || { echo "scale: operator not ready after 60 s" >&2; exit 1; }
  sleep 0.25
done

if [ -n "${SCALE_CPU_PROFILE:-}" ]; then
  curl -sf --max-time $((${SCALE_PROFILE_SECONDS:-60} + 30)) -o "$SCALE_CPU_PROFILE" \
    "http://127.0.0.1:$((OPERATOR_PORT + 2))/debug/pprof/profile?seconds=${SCALE_PROFILE_SECONDS:-60}" &
fi
step "simulating $N agents (heartbeat 10 s) and measuring"
# shellcheck disable=SC2086 # SCALE_FLAGS is a list of flags
if ! "$ST/scale" run -n "$N" -operator-pid "$OPERATOR_PID" -operator-metrics "http://127.0.0.1:$OPERATOR_PORT/metrics" \
  -operator-log "$ST/operator.log" ${SCALE_FLAGS:-}; then
  echo "scale: operator log tail:" >&2
  tail -5 "$ST/operator.log" >&2
  exit 1
fi
