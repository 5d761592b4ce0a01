#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# hack/soak.sh [DURATION] — the soak test (make soak DURATION=10m; make e2e runs it for 60 s). Builds the
# operator, agent, xferctl and hack/soak into a private directory, brings the demo up there on its own ports
# (hack/demo.sh up: kube-apiserver + etcd + kube-controller-manager, CRDs, operator, three agents, pool
# kv-cache), then hack/soak runs verified transfers through the agents' sockets for DURATION while one agent is
# restarted over and over and extra pools are created and deleted, samples the long-lived processes, and fails
# on a lost, hung or corrupt transfer, on growth of RSS, goroutines or fds past the warm-up baseline, or on
# objects left behind (see hack/soak/doc.go). Extra flags for hack/soak go in SOAK_FLAGS.
# Ports (below the ephemeral range, apart from every other script's): API 31443, etcd 31790/31800, agents
# 31470-31478, operator 31080-31081. Everything started is stopped on exit, whatever happened; the state
# directory is removed unless KEEP_STATE=1.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TOOLS=${BIN_DIR:-$ROOT/bin}
DURATION=${1:-${DURATION:-10m}}
export API_PORT=${SOAK_API_PORT:-31443} ETCD_PORT=${SOAK_ETCD_PORT:-31790}
export AGENT_PORT_BASE=${SOAK_AGENT_PORT_BASE:-31470} OPERATOR_PORT_BASE=${SOAK_OPERATOR_PORT_BASE:-31080}
WORK=$(mktemp -d /tmp/fabricxfer-soak.XXXXXX)
T0=$(date +%s)
export DEMO_DIR=$WORK/demo BIN_DIR=$WORK/bin
export DEMO_DECLARED=0 # the demo's three agents, no report-only ones

for b in kubectl etcd kube-apiserver; do
  [ -x "$TOOLS/$b" ] || { echo "soak: $TOOLS/$b missing: run make tools" >&2; exit 1; }
done
for port in "$API_PORT" "$ETCD_PORT" "$((ETCD_PORT + 10))" "$OPERATOR_PORT_BASE" "$((OPERATOR_PORT_BASE + 1))" \
  $(seq "$AGENT_PORT_BASE" $((AGENT_PORT_BASE + 8))); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "soak: port $port is in use (another soak run?); set SOAK_API_PORT, SOAK_ETCD_PORT, SOAK_AGENT_PORT_BASE, SOAK_OPERATOR_PORT_BASE" >&2
    rm -rf "$WORK"
    exit 1
  fi
done

cleanup() {
  local rc=$?
  hack/demo.sh down >/dev/null 2>&1 || true
  # Every process started here runs a binary under $WORK (the tools are linked into $WORK/bin).
  local left
  left=$(pgrep -f "$WORK/" || true)
  if [ -n "$left" ]; then
    echo "soak: FAIL: processes left behind: $left" >&2
    # shellcheck disable=SC2086 # one PID per word
    kill -9 $left 2>/dev/null || true
    rc=1
  fi
  [ "${KEEP_STATE:-0}" = 1 ] && echo "soak: state kept in $WORK" >&2 || rm -rf "$WORK"
  echo "soak: $([ "$rc" = 0 ] && echo passed || echo FAILED) after $(($(date +%s) - T0)) s of wall time (build, bring-up and teardown included)"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

step() { printf '==> %s\n' "$*"; }
logs() { for f in "$DEMO_DIR"/*.log "$DEMO_DIR"/kube/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -15 "$f" >&2; }; done; }

step "building the soak driver (and, unless SOAK_PREBUILT=1, operator, agent and xferctl) into $BIN_DIR"
mkdir -p "$BIN_DIR"
# SOAK_PREBUILT=1 (make e2e, right after make build) takes operator, agent and xferctl from BIN_DIR instead.
if [ "${SOAK_PREBUILT:-0}" = 1 ]; then
  go build -o "$BIN_DIR/" ./hack/soak
  linked="operator agent xferctl drakubelet nodecert"
else
  go build -o "$BIN_DIR/" ./cmd/operator ./cmd/agent ./cmd/xferctl ./hack/soak ./hack/drakubelet ./hack/nodecert
  linked=
fi
for b in kubectl etcd kube-apiserver kube-controller-manager kube-scheduler $linked; do
  if [ -x "$TOOLS/$b" ]; then ln -s "$TOOLS/$b" "$BIN_DIR/$b"; fi
done

step "built in $(($(date +%s) - T0)) s; bringing up the control plane, operator and three agents on 127.0.0.1:$API_PORT"
t0=$(date +%s)
if ! hack/demo.sh up >"$WORK/up.log" 2>&1 || ! grep -q "TransferPool kv-cache Ready" "$WORK/up.log"; then
  cat "$WORK/up.log" >&2
  logs
  echo "soak: FAIL: hack/demo.sh up" >&2
  exit 1
fi
step "up in $(($(date +%s) - t0)) s; soaking for $DURATION"

# The driver bounds each of its own waits; this bounds the whole run: DURATION plus 5 minutes for the churn cycle
# in progress, draining and the final checks.
secs=0
rest=$DURATION
while [[ $rest =~ ^([0-9]+)([hms])(.*)$ ]]; do
  case ${BASH_REMATCH[2]} in h) m=3600 ;; m) m=60 ;; s) m=1 ;; esac
  secs=$((secs + BASH_REMATCH[1] * m)) rest=${BASH_REMATCH[3]}
done
[ -z "$rest" ] && [ "$secs" -gt 0 ] || { echo "soak: DURATION $DURATION: want e.g. 90s, 10m, 1h30m" >&2; exit 2; }
# shellcheck disable=SC2086 # SOAK_FLAGS is a list of flags
if ! timeout --kill-after=10s $((secs + 300)) "$BIN_DIR/soak" -duration "$DURATION" -state "$DEMO_DIR" -kubeconfig "$DEMO_DIR/kube/kubeconfig" \
  -agent-port-base "$AGENT_PORT_BASE" -operator-metrics "http://127.0.0.1:$OPERATOR_PORT_BASE/metrics" ${SOAK_FLAGS:-}; then
  logs
  exit 1
fi
