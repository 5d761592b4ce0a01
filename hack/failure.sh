#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# hack/failure.sh — failure tests with real processes and a real API server. Brings up the demo (hack/demo.sh up
# in a private directory and ports: kube-apiserver + etcd, operator, three agents, pool kv-cache), then:
#   1. operator crash: SIGKILLs the operator with a second pool half applied (a ResourceQuota refuses its
#      DaemonSet), once as its workers start, and with that pool half finalized (an admission policy refuses to
#      delete its ClusterRoleBinding); restarts it each time and checks that exactly the expected objects exist, each
#      with the right owner, and that nothing of the deleted pool is left;
#   2. leader election: two operator replicas, only the leader reconciles; the leader is SIGKILLed and the other
#      takes over and keeps the pool status current (an agent dies and returns meanwhile);
#   3. API server restart: the API server is stopped and started again on the same etcd; agents' heartbeats
#      resume and the operator notices an agent that dies and returns afterwards, with no process restarted.
# Fails on the first step that does not hold, with the log tails of every process; tears everything down.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN_DIR:-$PWD/bin}
export DEMO_DIR=${FAILURE_DIR:-$(mktemp -d /tmp/fabricxfer-failure.XXXXXX)}
export API_PORT=${FAILURE_API_PORT:-30443} ETCD_PORT=${FAILURE_ETCD_PORT:-30790}
export AGENT_PORT_BASE=${FAILURE_AGENT_PORT_BASE:-30470} OPERATOR_PORT_BASE=${FAILURE_OPERATOR_PORT_BASE:-30080}
export DEMO_DECLARED=0 # the three-node demo: counts and the single vPOD below assume it
# Operators started here: replica i serves metrics on OP_PORT_BASE+2i and probes on OP_PORT_BASE+2i+1.
# Every port is below the kernel's ephemeral range (32768+), where a client connection could take it first.
OP_PORT_BASE=${FAILURE_OP_PORT_BASE:-30090}
ST=$DEMO_DIR
KUBE=$ST/kube
# shellcheck source=hack/names.sh
. hack/names.sh
CRASH=$(agent_object_name failure crash)
trap 'hack/demo.sh down >/dev/null 2>&1 || true' EXIT

fail() {
  echo "failure: FAIL: $*" >&2
  for f in "$ST"/*.log "$KUBE"/apiserver.log "$ST/objects.diff"; do [ -f "$f" ] && { echo "--- $f" >&2; tail -15 "$f" >&2; }; done
  exit 1
}
pass() { echo "failure: ok: $*"; }
kc() { "$BIN/kubectl" --kubeconfig "$KUBE/kubeconfig" "$@"; }
until_true() { # until_true SECONDS WHAT CMD...
  local limit=$1 what=$2 t0
  t0=$(date +%s)
  shift 2
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt $((t0 + limit)) ] || fail "$what (not true within $limit s)"
    sleep 0.5
  done
  pass "$what ($(($(date +%s) - t0)) s)"
}
jp() { kc get "$1" -o "jsonpath=$2" 2>/dev/null; }
equals() { [ "$(jp "$1" "$2")" = "$3" ]; }
alive() { kill -0 "$1" 2>/dev/null; }

# api PATH: a GET on the API server without kubectl's start-up cost, for tight polling.
api() {
  curl -sf --max-time 2 --cacert "$KUBE/pki/ca.crt" -H "Authorization: Bearer $(cut -d, -f1 "$KUBE/pki/tokens.csv")" \
    "https://127.0.0.1:$API_PORT$1"
}

# respawn NAME PIDFILE LOG: start the process recorded in PIDFILE again with its exact command line (read from
# /proc before it was stopped, saved in $ST/NAME.cmdline), recording the new PID in the same file.
save_cmdline() { cp "/proc/$(cat "$2")/cmdline" "$ST/$1.cmdline"; }
respawn() {
  local args
  mapfile -d '' args <"$ST/$1.cmdline"
  "${args[@]}" >>"$3" 2>&1 &
  echo $! >"$2"
  disown
}
# kill_when SECONDS WHAT PIDFILE CMD...: SIGKILL the process as soon as CMD succeeds (polled every 50 ms).
kill_when() {
  local limit=$1 what=$2 pidfile=$3 t0
  t0=$(date +%s)
  shift 3
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt $((t0 + limit)) ] || fail "$what (not true within $limit s)"
    sleep 0.05
  done
  kill -KILL "$(cat "$pidfile")"
  stop "$pidfile" KILL
  pass "SIGKILL when $what"
}
stop() { # stop PIDFILE [SIGNAL]: signal the process and wait (deadline 20 s) until it is gone
  local pid
  pid=$(cat "$1")
  kill "-${2:-TERM}" "$pid" 2>/dev/null || true
  for _ in $(seq 1 80); do alive "$pid" || return 0; sleep 0.25; done
  fail "process $pid ($1) still running 20 s after SIG${2:-TERM}"
}

op_start() { # op_start I [FLAGS...]: operator replica I, logging to $ST/op-I.log
  local i=$1
  shift
  [ -f "$ST/op-$i.log" ] && cat "$ST/op-$i.log" >>"$ST/op-$i.earlier.log" && rm "$ST/op-$i.log"
  "$BIN/operator" --kubeconfig "$KUBE/kubeconfig" --leader-election-namespace default --agent-namespace "$AGENT_NS" \
    --metrics-bind-address "127.0.0.1:$((OP_PORT_BASE + 2 * i))" \
    --health-probe-bind-address "127.0.0.1:$((OP_PORT_BASE + 2 * i + 1))" "$@" >>"$ST/op-$i.log" 2>&1 &
  echo $! >"$ST/op-$i.pid"
  disown # its SIGKILLs are on purpose: no job notices
}
metric() { # metric I NAME: the sum of every sample of NAME on replica I's metrics endpoint
  local m
  m=$(curl -sf --max-time 2 "http://127.0.0.1:$((OP_PORT_BASE + 2 * $1))/metrics") || return 1
  echo "$m" | awk -v m="$2" '$1 == m || index($1, m "{") == 1 { s += $2 } END { print s + 0 }'
}
is_leader() { [ "$(metric "$1" leader_election_master_status)" = 1 ]; }
reconciled() { [ "$(metric "$1" controller_runtime_reconcile_total)" -gt "$2" ]; }
some_leader() { is_leader 1 || is_leader 2; }
workers_started() { grep -q "Starting workers" "$ST/op-$1.log"; }

# owned_objects: one line per object the operator manages for pools (name prefix fabricxfer-agent-), in the
# agents' namespace, the pools' namespaces and cluster-wide:
# KIND NAMESPACE/NAME OWNERKIND/OWNERNAME/OWNERUID/CONTROLLER, sorted.
owned_objects() {
  kc get daemonsets,serviceaccounts,roles,rolebindings,secrets,clusterroles,clusterrolebindings -A -o \
    'jsonpath={range .items[*]}{.kind} {.metadata.namespace}/{.metadata.name} {range .metadata.ownerReferences[*]}{.kind}/{.name}/{.uid}/{.controller},{end}{"\n"}{end}' |
    awk '$2 ~ /(^|\/)fabricxfer-agent-/' | sort
}
expected_objects() { # expected_objects NS/POOL...: what owned_objects must print for exactly these pools
  local p ns name uid own n
  for p in "$@"; do
    ns=${p%/*} name=${p#*/}
    uid=$(kc get transferpool -n "$ns" "$name" -o 'jsonpath={.metadata.uid}')
    own="TransferPool/$name/$uid/true,"
    n=$(agent_object_name "$ns" "$name")
    echo "ClusterRoleBinding /$n "
    for k in DaemonSet ServiceAccount; do echo "$k $AGENT_NS/$n "; done
    echo "Secret $AGENT_NS/$n-tls "
    echo "Secret $AGENT_NS/$n-tls-ca "
    for k in Role RoleBinding; do echo "$k $ns/$n $own"; done
  done | sort
}
objects_are() { diff <(expected_objects "$@") <(owned_objects) >"$ST/objects.diff"; }
# The agents' bundle must trust the CA Secret's CA: a crash between the two writes must not leave agents
# unable to verify the certificates the operator signs for their peers.
certs_chain() { # certs_chain NS POOL
  local s
  s=$(agent_object_name "$1" "$2")-tls
  kc get secret -n "$AGENT_NS" "$s-ca" -o 'jsonpath={.data.tls\.crt}' | base64 -d >"$ST/chk-ca.crt"
  kc get secret -n "$AGENT_NS" "$s" -o 'jsonpath={.data.ca\.crt}' | base64 -d >"$ST/chk-bundle.crt"
  openssl verify -CAfile "$ST/chk-bundle.crt" "$ST/chk-ca.crt" >/dev/null
}
transfernodes() { # NAME OWNERKIND/OWNERNAME/OWNERUID per TransferNode, sorted
  kc get transfernodes -o 'jsonpath={range .items[*]}{.metadata.name} {range .metadata.ownerReferences[*]}{.kind}/{.name}/{.uid}{end}{"\n"}{end}' | sort
}
expected_transfernodes() {
  kc get nodes -o 'jsonpath={range .items[*]}{.metadata.name} Node/{.metadata.name}/{.metadata.uid}{"\n"}{end}' | sort
}
vpods() { kc get vpodtopologies -o 'jsonpath={range .items[*]}{.metadata.name} owners={.metadata.ownerReferences}{"\n"}{end}' | sort; }
# Agents heartbeat by renewing one Lease per (pool, node); the TransferNode is rewritten only when it changes.
heartbeats() { kc get leases -n default -l fabricxfer.io/pool=kv-cache -o 'jsonpath={range .items[*]}{.spec.renewTime}{"\n"}{end}'; }
heartbeats_after() { # every agent's heartbeat Lease was renewed later than $1 (seconds since the epoch)
  local h n=0
  for h in $(heartbeats); do
    [ "$(date -d "$h" +%s)" -gt "$1" ] || return 1
    n=$((n + 1))
  done
  [ "$n" = 3 ]
}
agent_ready() { curl -sf --max-time 2 "http://127.0.0.1:$((AGENT_PORT_BASE + 3 * $1 + 2))/readyz"; }
crash_pool_gone() { local out; out=$(kc get transferpool -n failure crash --ignore-not-found -o name) && [ -z "$out" ]; }
crash_observed() {
  local g o
  g=$(kc get transferpool -n failure crash -o 'jsonpath={.metadata.generation}')
  o=$(kc get transferpool -n failure crash -o 'jsonpath={.status.observedGeneration}')
  [ -n "$g" ] && [ "$g" = "$o" ]
}
crash_count() { owned_objects | grep -c -- "$CRASH" || true; }
POOL=transferpool/kv-cache
VPOD=

start=$(date +%s)
hack/demo.sh up >"$ST.up.log" 2>&1 || { cat "$ST.up.log" >&2; fail "hack/demo.sh up"; }
grep -q "TransferPool kv-cache Ready" "$ST.up.log" || fail "demo did not report the pool Ready"
rm -f "$ST.up.log"
VPOD=$(kc get vpodtopologies -o name)
[ "$(echo "$VPOD" | wc -l)" = 1 ] || fail "want one vPOD after demo up, got: $VPOD"
vpods_before=$(vpods)
pass "demo up: pool kv-cache Ready with three agents ($(($(date +%s) - start)) s)"

### 1. The operator killed mid-reconcile and restarted.
t1=$(date +%s)
stop "$ST/operator.pid" KILL
rm -f "$ST/operator.pid"
kc create namespace failure >/dev/null
# A quota of the one DaemonSet the agents' namespace holds (kv-cache's) stops the operator's apply after the
# ServiceAccount, Role, RoleBinding and ClusterRoleBinding, before the DaemonSet and the certificate Secrets: a
# reconcile that is half done.
kc create quota no-daemonsets -n "$AGENT_NS" --hard=count/daemonsets.apps=1 >/dev/null
kc apply -f - >/dev/null <<POOLYAML
apiVersion: fabricxfer.io/v1alpha1
kind: TransferPool
metadata: {name: crash, namespace: failure}
spec:
  nodeSelector: {fabricxfer.io/failure-test: "no-such-node"}
  engines: [tcp]
  agent: {heartbeatSeconds: 2}
POOLYAML
# Kill the operator as soon as the first object of the new pool exists, while the rest are still being applied;
# then once more a moment after its workers start, when kv-cache's heartbeats keep it reconciling.
op_start 0 --leader-elect=false
until_true 60 "the operator's apply of pool failure/crash stops at the DaemonSet quota" grep -q 'applying.*DaemonSet.*failure/crash' "$ST/op-0.log"
stop "$ST/op-0.pid" KILL
partial=$(owned_objects | awk -v n="$CRASH" 'index($2, n) {print $1}' | sort | tr '\n' ' ')
[ "$partial" = "ClusterRoleBinding Role RoleBinding ServiceAccount " ] ||
  fail "want the crash pool half applied (no DaemonSet, no Secrets) when the operator is killed, got: $partial"
pass "operator SIGKILLed with pool failure/crash half applied: $partial"
kc delete quota no-daemonsets -n "$AGENT_NS" >/dev/null
op_start 0 --leader-elect=false
kill_when 60 "the restarted operator's workers start" "$ST/op-0.pid" workers_started 0
op_start 0 --leader-elect=false
until_true 60 "after two SIGKILLs, exactly the expected objects of both pools, each owned by its pool" \
  objects_are default/kv-cache failure/crash
certs_chain failure crash || fail "the crash pool's agent certificate does not verify against its CA Secret"
certs_chain default kv-cache || fail "kv-cache's agent certificate does not verify against its CA Secret"
pass "each pool's agent certificate chains to its CA Secret"
until_true 30 "pool failure/crash status observed by the restarted operator" crash_observed
equals $POOL '{.status.nodes}' 3/3 || fail "kv-cache nodes $(jp $POOL '{.status.nodes}'), want 3/3"
[ "$(transfernodes)" = "$(expected_transfernodes)" ] || fail "TransferNodes: $(transfernodes); want: $(expected_transfernodes)"
[ "$(vpods)" = "$vpods_before" ] || fail "vPODs after the restarts: $(vpods); before: $vpods_before"
pass "kv-cache 3/3, three TransferNodes owned by their Nodes, the same single vPOD"

# A pool deleted while the operator is down, whose finalizer is then interrupted: nothing of it may survive.
stop "$ST/op-0.pid" KILL
# An admission policy that refuses to delete the crash pool's ClusterRoleBinding stops the finalizer after the
# DaemonSet, with the finalizer still on the pool.
kc apply -f - >/dev/null <<POLICY
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: failure-keep-clusterrole}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules: [{apiGroups: [rbac.authorization.k8s.io], apiVersions: [v1], operations: [DELETE], resources: [clusterrolebindings]}]
  validations: [{expression: "oldObject.metadata.name != '$CRASH'", message: held by the failure test}]
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: failure-keep-clusterrole}
spec: {policyName: failure-keep-clusterrole, validationActions: [Deny]}
POLICY
binding_held() { ! kc delete clusterrolebinding "$CRASH" --dry-run=server; }
until_true 30 "the admission policy holds the crash pool's ClusterRoleBinding" binding_held
kc delete transferpool -n failure crash --wait=false >/dev/null
sleep 1
crash_pool_gone && fail "pool failure/crash went away with no operator to run its finalizer"
echo "failure: deleted with the operator down, the crash pool still has its finalizer and $(crash_count) of its 7 objects"
op_start 0 --leader-elect=false
until_true 60 "the operator's finalizer of pool failure/crash stops at the held ClusterRoleBinding" grep -q 'held by the failure test' "$ST/op-0.log"
stop "$ST/op-0.pid" KILL
partial=$(owned_objects | awk -v n="$CRASH" 'index($2, n) {print $1}' | sort | tr '\n' ' ')
# The certificate controller deletes the two certificate Secrets on its own once the DaemonSet is gone, so they
# may or may not have gone before the kill; the pool controller's objects after the DaemonSet stay.
case "$partial" in
  "ClusterRoleBinding Role RoleBinding Secret Secret ServiceAccount " | "ClusterRoleBinding Role RoleBinding ServiceAccount ") ;;
  *) partial="unexpected: $partial" ;;
esac
[ "${partial#unexpected}" = "$partial" ] && ! crash_pool_gone ||
  fail "want the crash pool half finalized (DaemonSet deleted, ClusterRoleBinding not) when the operator is killed, got: $partial"
pass "operator SIGKILLed with pool failure/crash half finalized: $partial"
kc delete validatingadmissionpolicybinding,validatingadmissionpolicy failure-keep-clusterrole >/dev/null
op_start 0 --leader-elect=false
until_true 60 "pool failure/crash gone after a SIGKILL during its finalizer" crash_pool_gone
until_true 60 "only kv-cache's objects remain, none orphaned" objects_are default/kv-cache
pass "operator crash: converged with no duplicate or orphaned object ($(($(date +%s) - t1)) s)"
stop "$ST/op-0.pid" TERM

### 2. Two replicas with leader election: only the leader acts; the other takes over when it is killed.
t2=$(date +%s)
op_start 1 --leader-elect=true
op_start 2 --leader-elect=true
until_true 60 "one replica holds the lease" some_leader
if is_leader 1; then L=1 F=2; else L=2 F=1; fi
until_true 30 "the leader (replica $L) reconciles" reconciled "$L" 0
until_true 30 "the standby (replica $F) is up and serving metrics" metric "$F" leader_election_master_status
sleep 3 # several heartbeat periods: the leader reconciles kv-cache every 2 s
[ "$(metric "$F" controller_runtime_reconcile_total)" = 0 ] ||
  fail "standby replica $F reconciled $(metric "$F" controller_runtime_reconcile_total) times"
! is_leader "$F" || fail "both replicas report leadership"
grep -q "Starting workers" "$ST/op-$F.log" && fail "standby replica $F started its controllers"
pass "standby replica $F: no reconcile, no workers, not leader; leader $L: $(metric "$L" controller_runtime_reconcile_total) reconciles"

save_cmdline agent-gpu-node-b "$ST/agent-gpu-node-b.pid"
stop "$ST/op-$L.pid" KILL
pass "leader replica $L SIGKILLed (its lease is not released)"
stop "$ST/agent-gpu-node-b.pid" TERM
until_true 45 "standby replica $F takes over the lease" is_leader "$F"
until_true 30 "the new leader marks gpu-node-b not ready (2/3)" equals $POOL '{.status.nodes}' 2/3
until_true 20 "the new leader lists gpu-node-b missing from the vPOD" equals "$VPOD" '{.status.missingMembers[0]}' gpu-node-b
respawn agent-gpu-node-b "$ST/agent-gpu-node-b.pid" "$ST/agent-gpu-node-b.log"
until_true 60 "gpu-node-b's agent is back" agent_ready 1
until_true 30 "the new leader counts gpu-node-b ready again (3/3)" equals $POOL '{.status.nodes}' 3/3
until_true 20 "the vPOD is complete again" equals "$VPOD" '{.status.missingMembers}' ""
pass "leader election: only the leader acted, the standby took over ($(($(date +%s) - t2)) s)"
stop "$ST/op-$F.pid" TERM

### 3. The API server restarted (SIGKILLed: a graceful stop waits for open watches, up to a minute): operator and agents reconnect without being restarted.
t3=$(date +%s)
# A single replica without leader election: with it, an outage longer than the renew deadline (10 s) makes the
# leader exit on purpose and its Deployment restart it; here the point is that nothing needs restarting.
op_start 0 --leader-elect=false
until_true 60 "operator replica 0 running again" workers_started 0
pids=$(cat "$ST/op-0.pid" "$ST"/agent-*.pid | tr "\n" " ")
save_cmdline apiserver "$KUBE/apiserver.pid"
save_cmdline agent-rdma-node-c "$ST/agent-rdma-node-c.pid"
stop "$KUBE/apiserver.pid" KILL
down_at=$(date +%s)
sleep 4 # two heartbeat periods without an API server: agents' writes and everyone's watches fail
respawn apiserver "$KUBE/apiserver.pid" "$KUBE/apiserver.log"
until_true 90 "kube-apiserver serves again" api /readyz
pass "API server was unavailable for $(($(date +%s) - down_at)) s"
until_true 45 "all three agents' heartbeats resume" heartbeats_after "$((down_at + 1))"
for p in $pids; do alive "$p" || fail "process $p exited during the API server restart"; done
pass "operator and agents kept running (pids $pids)"
up_at=$(date +%s)
stop "$ST/agent-rdma-node-c.pid" TERM
until_true 30 "the operator notices rdma-node-c's agent dying after the restart (2/3)" equals $POOL '{.status.nodes}' 2/3
respawn agent-rdma-node-c "$ST/agent-rdma-node-c.pid" "$ST/agent-rdma-node-c.log"
until_true 60 "rdma-node-c's agent is back" agent_ready 2
until_true 30 "the operator counts rdma-node-c ready again (3/3)" equals $POOL '{.status.nodes}' 3/3
reconnect=$(grep -c "Reconciler error" "$ST/op-0.log" || true)
pass "API server restart: heartbeats and pool status resumed ($(($(date +%s) - t3)) s; $reconnect reconcile errors logged while it was down, agent loss and return counted $(($(date +%s) - up_at)) s after the heartbeats resumed)"

### Teardown: nothing may be left running.
hack/demo.sh down >/dev/null
trap - EXIT
# Processes started here all name a path under the state directory (kubeconfig, data or socket dir).
left=$(pgrep -f "$ST/" || true)
[ -z "$left" ] || fail "processes left behind: $left"
pass "teardown left no process behind; failure tests passed in $(($(date +%s) - start)) s"
