#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# hack/scale.sh [N] — the scale harness (make scale N=1000): a private local control plane (real kube-apiserver +
# etcd on API_PORT 29443 / ETCD_PORT 29790, so it never meets the demo or the tests), the CRDs, N Node objects,
# the operator as a process, then hack/scale simulates N agents in one process, applies a TransferPool that
# selects every node and measures convergence, the operator's peak RSS and the API request rate.
# The last line is: converged N nodes in X s, operator RSS Y MiB, API Z req/s
# OPERATOR_FLAGS are added to the operator's command line (OPERATOR_FLAGS=--dra-vpod-devices=0: no vPOD slices).
# RUNS=K (make scale N=1000 RUNS=3) repeats the whole measurement K times, each on a fresh control plane, and
# ends with the median and the worst convergence and operator peak RSS, and the failed agent rounds of each run.
# Extra flags for hack/scale run go in SCALE_FLAGS (e.g. "-window 60s -ramp 0"). SCALE_CPU_PROFILE=FILE saves the
# operator's CPU profile over the first SCALE_PROFILE_SECONDS (default 60) of the measured run. Everything it started is
# stopped on exit; the state directory is removed unless KEEP_STATE=1.
# The simulated agents authenticate as the pool's agent ServiceAccount (a static token for its user name and
# groups), so the API server applies the RBAC the operator grants them and API Priority and Fairness queues them
# as it does real agents' requests: in the agents' own flow schemas and priority level (fabricxfer-agent-leases,
# fabricxfer-agents; config/flowcontrol/agent_priority.yaml, which the chart and dist/install.yaml ship), or with
# SCALE_AGENT_APF=off, which leaves those out, in service-accounts/workload-low as without them.
# SCALE_AGENT_IDENTITY=admin has them use the admin token instead (system:masters, which APF exempts), for comparison.
# The operator runs as its installed ServiceAccount with its installed RBAC (config/rbac) and a token the API
# server issues, so APF queues it as an installed operator (flow schema fabricxfer-operator, or service-accounts
# without the schemas); SCALE_OPERATOR_IDENTITY=admin runs it as admin (exempt), as earlier runs did.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BIN=${BIN_DIR:-$ROOT/bin}
N=${1:-${N:-100}}
export API_PORT=${SCALE_API_PORT:-29443} ETCD_PORT=${SCALE_ETCD_PORT:-29790}
OPERATOR_PORT=${SCALE_OPERATOR_PORT:-29480} # below the ephemeral range, so no outgoing connection holds it
RUNS=${RUNS:-1}

if [ "$RUNS" -gt 1 ]; then
  LOGS=$(mktemp -d /tmp/fabricxfer-scale-runs.XXXXXX)
  trap 'rm -rf "$LOGS"' EXIT
  failed_runs=0
  for i in $(seq 1 "$RUNS"); do
    printf '==> run %d of %d (load average %s)\n' "$i" "$RUNS" "$(cut -d' ' -f1-3 /proc/loadavg)"
    RUNS=1 "$0" "$N" 2>&1 | tee "$LOGS/$i.log" || failed_runs=$((failed_runs + 1))
  done
  # Per run: seconds after the last first report (a run that did not converge counts as infinitely slow),
  # operator peak RSS in MiB, failed agent rounds.
  for i in $(seq 1 "$RUNS"); do
    awk -v run="$i" '
      /^converged [0-9.]+ s after the last first report/ { conv = $2 }
      /^operator memory: peak RSS/ { rss = $6 }
      /^agent report rounds that failed:/ { failed = $NF }
      END { printf "%s %s %s %s\n", run, (conv == "" ? "inf" : conv), (rss == "" ? "nan" : rss), (failed == "" ? "?" : failed) }
    ' "$LOGS/$i.log"
  done >"$LOGS/summary"
  echo "==> $RUNS runs of N=$N (run, converge s after the last first report, operator peak RSS MiB, failed agent rounds):"
  cat "$LOGS/summary"
  median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
  conv_median=$(awk '{ print $2 }' "$LOGS/summary" | median)
  conv_worst=$(awk '{ print $2 }' "$LOGS/summary" | sort -g | tail -1)
  rss_median=$(awk '{ print $3 }' "$LOGS/summary" | median)
  rss_worst=$(awk '{ print $3 }' "$LOGS/summary" | sort -g | tail -1)
  failed_rounds=$(awk '{ s += $4 } END { print s + 0 }' "$LOGS/summary")
  echo "$RUNS runs of $N nodes: converge median $conv_median s, worst $conv_worst s; operator peak RSS median $rss_median MiB, worst $rss_worst MiB; failed agent rounds $failed_rounds; runs that failed $failed_runs"
  [ "$failed_runs" -eq 0 ]
  exit
fi

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

AGENT_IDENTITY=${SCALE_AGENT_IDENTITY:-serviceaccount}
OPERATOR_IDENTITY=${SCALE_OPERATOR_IDENTITY:-serviceaccount}
case $OPERATOR_IDENTITY in
serviceaccount | admin) ;;
*) echo "scale: SCALE_OPERATOR_IDENTITY is serviceaccount or admin, not $OPERATOR_IDENTITY" >&2; exit 2 ;;
esac
AGENT_APF=${SCALE_AGENT_APF:-on}
case $AGENT_APF in
on | off) ;;
*) echo "scale: SCALE_AGENT_APF is on or off, not $AGENT_APF" >&2; exit 2 ;;
esac
AGENT_FLAGS=()
EXTRA_TOKENS=
case $AGENT_IDENTITY in
serviceaccount)
  # The user and groups the API server gives a ServiceAccount's tokens; the agent namespace is the operator's
  # default (it runs with no --agent-namespace here).
  # shellcheck disable=SC2086 # SCALE_FLAGS may name another pool
  agent_user=$("$ST/scale" agent-user ${SCALE_FLAGS:-})
  agent_ns=${agent_user#system:serviceaccount:}
  agent_ns=${agent_ns%%:*}
  (umask 077 && openssl rand -hex 16 >"$ST/agent-token")
  EXTRA_TOKENS="$(cat "$ST/agent-token"),$agent_user,$agent_user,\"system:serviceaccounts,system:serviceaccounts:$agent_ns,system:authenticated\""
  AGENT_FLAGS=(-agent-token-file "$ST/agent-token")
  ;;
admin) AGENT_APF="off (admin is exempt)" ;;
*) echo "scale: SCALE_AGENT_IDENTITY is serviceaccount or admin, not $AGENT_IDENTITY" >&2; exit 2 ;;
esac

step "starting kube-apiserver + etcd on 127.0.0.1:$API_PORT"
# On a loaded machine etcd can start slower than kube-apiserver waits for it; a few more tries cover that.
for try in 1 2 3; do
  BIN_DIR=$BIN EXTRA_TOKENS=$EXTRA_TOKENS hack/kube-up.sh "$ST/kube" >/dev/null 2>"$ST/kube-up.err" && break
  echo "scale: control plane did not start (try $try of 3); etcd log tail:" >&2
  tail -3 "$ST/kube/etcd.log" >&2 || true
  BIN_DIR=$BIN hack/kube-down.sh "$ST/kube"
  [ "$try" -lt 3 ] || { tail -5 "$ST/kube-up.err" >&2; exit 1; }
done
export KUBECONFIG=$ST/kube/kubeconfig
kc apply -f config/crd/bases >/dev/null
# The agents' ClusterRole, as the chart installs it; the operator binds it to each pool's agents. (Not the
# agents' ValidatingAdmissionPolicy: it needs the node a pod-bound token names, which a static token lacks.)
kc apply -f config/rbac/agent_role.yaml >/dev/null
if [ "$AGENT_APF" = on ]; then
  # The agents' flow schemas and priority level as the chart installs them, for the agents' namespace; the API
  # server marks a schema not Dangling once it has taken in the level it names.
  sed "s/^\(        namespace:\) fabricxfer-system\$/\1 $agent_ns/" config/flowcontrol/agent_priority.yaml | kc apply -f - >/dev/null
  kc wait --for=condition=Dangling=False --timeout=60s flowschema/fabricxfer-agents flowschema/fabricxfer-agent-leases >/dev/null
fi
kc wait --for=condition=Established --timeout=60s crd/transferpools.fabricxfer.io crd/transfernodes.fabricxfer.io crd/vpodtopologies.fabricxfer.io >/dev/null

step "creating $N Node objects"
"$ST/scale" nodes -n "$N"

step "starting the operator (agents' namespace fabricxfer-system; $OPERATOR_IDENTITY identity)"
kc create namespace fabricxfer-system >/dev/null
OPERATOR_KUBECONFIG=$ST/kube/kubeconfig
if [ "$OPERATOR_IDENTITY" = serviceaccount ]; then
  # The operator's ServiceAccount and RBAC as installed, and a token the API server issues for it: its requests
  # are authorized and queued (flow schema fabricxfer-operator, level workload-low) as an installed operator's.
  kc apply -f config/rbac/service_account.yaml -f config/rbac/role.yaml -f config/rbac/role_binding.yaml \
    -f config/rbac/dra_role.yaml -f config/rbac/dra_role_binding.yaml >/dev/null
  operator_token=$(kc -n fabricxfer-system create token fabricxfer-operator --duration=6h)
  OPERATOR_KUBECONFIG=$ST/operator.kubeconfig
  (umask 077 && sed "s|token: \"[^\"]*\"|token: \"$operator_token\"|" "$ST/kube/kubeconfig" >"$OPERATOR_KUBECONFIG")
fi
# shellcheck disable=SC2086 # OPERATOR_FLAGS is a list of flags
KUBECONFIG=$OPERATOR_KUBECONFIG "$ST/operator" --leader-elect=false --metrics-bind-address="127.0.0.1:$OPERATOR_PORT" \
  --health-probe-bind-address="127.0.0.1:$((OPERATOR_PORT + 1))" --pprof-bind-address="127.0.0.1:$((OPERATOR_PORT + 2))" \
  ${OPERATOR_FLAGS:-} >"$ST/operator.log" 2>&1 &
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
step "simulating $N agents ($AGENT_IDENTITY identity; flow schemas fabricxfer-agent*: $AGENT_APF) and measuring"
# shellcheck disable=SC2086 # SCALE_FLAGS is a list of flags
if ! "$ST/scale" run -n "$N" -operator-pid "$OPERATOR_PID" -operator-metrics "http://127.0.0.1:$OPERATOR_PORT/metrics" \
  -apiserver-pid "$(cat "$ST/kube/apiserver.pid")" -etcd-pid "$(cat "$ST/kube/etcd.pid")" \
  -operator-log "$ST/operator.log" "${AGENT_FLAGS[@]}" ${SCALE_FLAGS:-}; then
  echo "scale: operator log tail:" >&2
  tail -5 "$ST/operator.log" >&2
  exit 1
fi
