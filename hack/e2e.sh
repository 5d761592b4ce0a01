#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# hack/e2e.sh — the demo as a test: brings up the control plane, operator and five agents (hack/demo.sh up in
# a private directory and ports), checks pool and vPOD status, the declared vPOD (the domain keys its agents
# report, explain for a GPU pair inside and one outside it) and a transfer, that every documented metric is
# served and moves with a transfer, and the operator's and agents' Events, kills an agent and checks that
# the pool notices and recovers, deletes the pool and checks that everything it owned is gone, and tears down.
# Fails on the first step that does not hold.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN_DIR:-$PWD/bin}
export DEMO_DIR=${E2E_DIR:-$(mktemp -d /tmp/fabricxfer-e2e.XXXXXX)}
export API_PORT=${E2E_API_PORT:-26443} ETCD_PORT=${E2E_ETCD_PORT:-25790}
export AGENT_PORT_BASE=${E2E_AGENT_PORT_BASE:-27470} OPERATOR_PORT_BASE=${E2E_OPERATOR_PORT_BASE:-28080}
# shellcheck source=hack/names.sh
. hack/names.sh
trap 'hack/demo.sh down >/dev/null 2>&1 || true' EXIT

fail() {
  echo "e2e: FAIL: $*" >&2
  for f in "$DEMO_DIR"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -15 "$f" >&2; }; done
  exit 1
}
pass() { echo "e2e: ok: $*"; }
kc() { "$BIN/kubectl" --kubeconfig "$DEMO_DIR/kube/kubeconfig" "$@"; }
until_true() { # until_true SECONDS WHAT CMD...
  local deadline=$(($(date +%s) + $1)) what=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "$what (not true after ${deadline}s deadline)"
    sleep 0.5
  done
  pass "$what"
}
jp() { kc get "$1" -o "jsonpath=$2" 2>/dev/null; }
equals() { [ "$(jp "$1" "$2")" = "$3" ]; }

start=$(date +%s)
hack/demo.sh up >"$DEMO_DIR.up.log" 2>&1 || { cat "$DEMO_DIR.up.log" >&2; fail "hack/demo.sh up"; }
grep -q "TransferPool kv-cache Ready" "$DEMO_DIR.up.log" || fail "demo did not report the pool Ready"
grep -q "^verified: read back 67108864 bytes" "$DEMO_DIR.up.log" || fail "the checksummed write did not verify"
grep -q "^read 67108864 bytes from rdma-node-c/kv-c" "$DEMO_DIR.up.log" || fail "the read did not complete"
grep -q "kv-c: tcp$" "$DEMO_DIR.up.log" || fail "explain did not pick tcp for a cross-node host pair"
grep -Eq "^pod default/decode bound to gpu-node-[ab] by the scheduler" "$DEMO_DIR.up.log" ||
  fail "kube-scheduler did not bind the vPOD claim's pod to a node of that vPOD"
grep -q "CDI env FABRICXFER_SOCKET=/run/fabricxfer/agent.sock" "$DEMO_DIR.up.log" || fail "the prepared claim's CDI spec set no FABRICXFER_SOCKET"
grep -q "^verified: read back 1048576 bytes" "$DEMO_DIR.up.log" || fail "the claim's client did not transfer through its socket"
pass "demo up: pool Ready, explain, 64 MiB write verified and read back, a DRA claim placed in its vPOD and prepared ($(($(date +%s) - start)) s)"

# The declared vPOD: GPUs 0-3 of gpu-node-d and gpu-node-e are in it, by declaration; 4-7 in no domain.
DECLARED=ualink:5e1f0d2c-7a3b-4c8d-9e0f-1a2b3c4d5e6f/7
for n in gpu-node-d gpu-node-e; do
  equals "transfernode/$n" '{.status.gpus[*].fabric.domain}' "$DECLARED $DECLARED $DECLARED $DECLARED" ||
    fail "$n reports domains '$(jp "transfernode/$n" '{.status.gpus[*].fabric.domain}')', want $DECLARED on GPUs 0-3 only"
  equals "transfernode/$n" '{.status.gpus[*].fabric.source}' "declared declared declared declared" ||
    fail "$n reports sources '$(jp "transfernode/$n" '{.status.gpus[*].fabric.source}')'"
  equals "transfernode/$n" '{.status.declarations[0].vpodTopology}={.status.declarations[0].gpus}' 'demo-declared=[0,1,2,3]' ||
    fail "$n's record of the declaration: $(jp "transfernode/$n" '{.status.declarations}')"
done
equals vpodtopology/demo-declared '{.status.nodes}/{.status.gpus}' 2/8 || fail "declared vPOD status: $(jp vpodtopology/demo-declared '{.status}')"
equals vpodtopology/demo-declared '{.status.conditions[?(@.type=="Declared")].status}' True ||
  fail "declared vPOD conditions: $(jp vpodtopology/demo-declared '{.status.conditions}')"
pass "gpu-node-d and gpu-node-e report GPUs 0-3 in $DECLARED (source declared), the vPOD counts 2 nodes and 8 GPUs, Declared=True"
# Their agents only report, so no engine runs between them: explain says which would carry each pair.
grep -q "^gpu-node-d/1 -> gpu-node-e/2: no engine running, fabric once both agents run it " "$DEMO_DIR.up.log" ||
  fail "explain did not name fabric for a GPU pair inside the declared vPOD"
grep -q "fabric    no   same fabric domain $DECLARED, decided by VPodTopology demo-declared, but the fabric engine is not running on gpu-node-d: this agent only reports" "$DEMO_DIR.up.log" ||
  fail "explain did not name the declaration that decided, or why fabric does not run"
grep -q "^gpu-node-d/1 -> gpu-node-e/5: no engine running, rdma once both agents run it " "$DEMO_DIR.up.log" ||
  fail "explain did not name rdma for a GPU pair outside the declared vPOD"
grep -q "gpu-node-e GPU 5: in no fabric domain" "$DEMO_DIR.up.log" || fail "explain did not say GPU 5 is outside every domain"
pass "explain: gpu-node-d/1 -> gpu-node-e/2 fabric once run (decided by demo-declared), gpu-node-d/1 -> gpu-node-e/5 rdma once run"

# Every metric docs/observability.md lists is served by gpu-node-a's agent or the operator, and the transfer
# counters and latency histogram move when a transfer runs.
scrape() { curl -sf "http://127.0.0.1:$1/metrics"; }
AGENT_A_METRICS=$((AGENT_PORT_BASE + 2))
served=$({ scrape $AGENT_A_METRICS; scrape "$OPERATOR_PORT_BASE"; }) || fail "scraping the agent and the operator"
for m in $(grep -o 'fabricxfer_[a-z0-9_]*[a-z0-9]' docs/observability.md | sort -u); do
  [ "$m" = fabricxfer_agent_edge_refusals_total ] && continue # served from the first refusal on
  grep -q -e "^$m[{ ]" -e "^${m}_bucket{" <<<"$served" || fail "$m is documented but neither the agent nor the operator serves it"
done
pass "every documented metric is served"
sum_of() { scrape $AGENT_A_METRICS | awk -v m="$1" 'index($0, m) == 1 && /status="ok"/ {s += $NF} END {print s + 0}'; }
ops_before=$(sum_of 'fabricxfer_transfer_ops_total{') count_before=$(sum_of 'fabricxfer_transfer_duration_seconds_count{')
"$BIN/xferctl" transfer --socket "$DEMO_DIR/sockets/gpu-node-a/kv-cache/agent.sock" --to rdma-node-c/kv-c --size 1Mi \
  >/dev/null || fail "a 1 MiB transfer from gpu-node-a"
ops_after=$(sum_of 'fabricxfer_transfer_ops_total{') count_after=$(sum_of 'fabricxfer_transfer_duration_seconds_count{')
[ "$ops_after" -gt "$ops_before" ] && [ "$count_after" -gt "$count_before" ] ||
  fail "a transfer moved ops $ops_before -> $ops_after, latency observations $count_before -> $count_after"
pass "a transfer moves the ops counter ($ops_before -> $ops_after) and the latency histogram"

POOL=transferpool/kv-cache
equals $POOL '{.status.nodes}' 5/5 || fail "pool nodes $(jp $POOL '{.status.nodes}'), want 5/5"
# The engines the agents run: the three that serve a socket run the same-node engine (host memory on these
# fixture GPUs and the GPU-less node) and tcp; fabric and rdma need a GPU runtime and libibverbs this machine
# lacks. Detection allows fabric on gpu-node-a and -b by their hardware's vPOD and on gpu-node-d and -e by the
# declared one, and rdma on all five.
equals $POOL '{.status.engineSummary}' "xgmi=3 fabric=0 rdma=0 tcp=3" || fail "engines: $(jp $POOL '{.status.engineSummary}')"
equals $POOL '{.status.engines[*].available}' "4 4 5 5" || fail "engines detected: $(jp $POOL '{.status.engines}')"
equals transfernode/gpu-node-a '{.status.engines[?(@.name=="rdma")].available}/{.status.engines[?(@.name=="rdma")].running}' true/false ||
  fail "gpu-node-a's rdma: $(jp transfernode/gpu-node-a '{.status.engines}')"
pass "pool status 5/5, engines run xgmi=3 fabric=0 rdma=0 tcp=3, detected 4 4 5 5"

# The rules on the live cluster: the hardware wins over a declaration that disagrees (gpu-node-a's GPU 0 reports
# its UALink vPOD), and a deleted declaration leaves its nodes within a heartbeat (2 s).
HW=ualink:1c9e2f4a-6b7d-4e11-9a2b-3c4d5e6f7081/1
kc apply -f - >/dev/null <<VPOD || fail "declaring a vPOD the hardware contradicts"
apiVersion: fabricxfer.io/v1alpha1
kind: VPodTopology
metadata: {name: e2e-contradicted}
spec: {kind: ualink, domain: "ualink:5e1f0d2c-7a3b-4c8d-9e0f-1a2b3c4d5e6f/8", members: [{node: gpu-node-a, gpus: [0]}]}
VPOD
declared_reason() { jp vpodtopology/e2e-contradicted '{.status.conditions[?(@.type=="Declared")].reason}'; }
until_true 15 "a declaration the hardware contradicts is refused (Declared=False, DeclarationConflict)" eval '[ "$(declared_reason)" = DeclarationConflict ]'
jp vpodtopology/e2e-contradicted '{.status.conditions[?(@.type=="Declared")].message}' | grep -qF "gpu-node-a: GPU 0: the hardware reports $HW" ||
  fail "the conflict does not name the node and the hardware's key: $(jp vpodtopology/e2e-contradicted '{.status.conditions}')"
equals transfernode/gpu-node-a '{.status.gpus[0].fabric.domain}/{.status.gpus[0].fabric.source}' "$HW/discovered" ||
  fail "gpu-node-a's GPU 0 is routed by $(jp transfernode/gpu-node-a '{.status.gpus[0].fabric}')"
pass "the contradicted declaration names gpu-node-a's hardware key; GPU 0 stays in $HW (discovered)"
kc delete vpodtopology e2e-contradicted demo-declared >/dev/null || fail "deleting the declarations"
deleted=$(date +%s%N)
until_true 4 "gpu-node-d and gpu-node-e leave the deleted vPOD" \
  eval 'equals transfernode/gpu-node-d "{.status.gpus[*].fabric.domain}" "" && equals transfernode/gpu-node-e "{.status.gpus[*].fabric.domain}" ""'
echo "e2e: the declared domain left both reports $((($(date +%s%N) - deleted) / 1000000)) ms after the delete (heartbeat 2 s)"
until_true 10 "the pool counts fabric detected on gpu-node-a and -b only again" equals $POOL '{.status.engines[?(@.name=="fabric")].available}' 2
reasons() { kc -n default get events.events.k8s.io -o jsonpath='{range .items[*]}{.regarding.kind}/{.reason}{"\n"}{end}'; }
has_event() { # not reasons | grep -q: grep stops reading early, and pipefail turns kubectl's SIGPIPE into a failure
  local r
  r=$(reasons) && grep -qx "$1" <<<"$r"
}
for e in TransferPool/PoolReady TransferPool/CertificatesIssued VPodTopology/DomainCreated TransferNode/EnginesReported; do
  has_event "$e" || fail "no $e Event (have: $(reasons | sort -u | tr '\n' ' '))"
done
pass "Events: PoolReady, CertificatesIssued, DomainCreated, EnginesReported"
vpod=$(kc get vpodtopologies -l fabricxfer.io/discovered=true -o name)
[ "$(echo "$vpod" | wc -l)" = 1 ] || fail "want one discovered vPOD, got: $vpod"
equals "$vpod" '{.status.nodes}' 2 || fail "vPOD members: $(jp "$vpod" '{.status.members}')"
equals "$vpod" '{.status.gpus}' 8 || fail "vPOD GPUs: $(jp "$vpod" '{.status.gpus}')"
pass "one UALink vPOD with gpu-node-a and gpu-node-b, 8 GPUs"
AGENTS=$(agent_object_name default kv-cache)
kc -n "$AGENT_NS" get daemonset "$AGENTS" >/dev/null || fail "no agent DaemonSet in $AGENT_NS"
[ -z "$(kc -n default get daemonsets,serviceaccounts,secrets -l fabricxfer.io/pool=kv-cache -o name)" ] ||
  fail "the pool's agents, ServiceAccount or certificates are in the tenant's namespace"
pass "agent DaemonSet $AGENT_NS/$AGENTS exists; nothing privileged in the pool's namespace"

# An agent that dies: its node turns not ready within the heartbeat timeout (3 x 2 s) and its vPOD shows it missing.
kill "$(cat "$DEMO_DIR/agent-gpu-node-b.pid")"
until_true 20 "pool notices the dead agent on gpu-node-b (4/5)" equals $POOL '{.status.nodes}' 4/5
until_true 20 "vPOD lists gpu-node-b as missing" equals "$vpod" '{.status.missingMembers[0]}' gpu-node-b
until_true 20 "a NodesNotReady Event on the pool and a MembersMissing Event on the vPOD" \
  eval 'has_event TransferPool/NodesNotReady && has_event VPodTopology/MembersMissing'

# Pool deletion removes what the operator made for it.
kc delete transferpool kv-cache --wait=true --timeout=60s >/dev/null || fail "deleting the pool"
# all_gone NS OBJECT...: none of the objects exists (kubectl get of several fails as soon as one is missing).
all_gone() {
  local ns=$1 o
  shift
  for o; do kc -n "$ns" get "$o" >/dev/null 2>&1 && return 1; done
  return 0
}
until_true 60 "agent DaemonSet, ServiceAccount and certificate Secrets removed by the finalizer" \
  all_gone "$AGENT_NS" daemonset/"$AGENTS" serviceaccount/"$AGENTS" secret/"$AGENTS-tls" secret/"$AGENTS-tls-ca"
until_true 30 "cluster RBAC removed by the finalizer" all_gone "" clusterrolebinding/"$AGENTS"
until_true 60 "the agents' Role and RoleBinding in the pool's namespace removed" \
  all_gone default role/"$AGENTS" rolebinding/"$AGENTS"

hack/demo.sh down >/dev/null
trap - EXIT
left=$(pgrep -f "$DEMO_DIR/" || true)
[ -z "$left" ] || fail "processes left behind: $left"
rm -f "$DEMO_DIR.up.log"
pass "demo down left no process behind; e2e passed in $(($(date +%s) - start)) s"
