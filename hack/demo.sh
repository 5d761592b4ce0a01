#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# hack/demo.sh up|down — the main job on an embedded default, on one machine:
#   a real kube-apiserver + etcd on loopback, the CRDs applied with kubectl, three Node objects backed by
#   fixture host roots (two GPU nodes of one UALink vPOD, one RDMA-only node), the operator and one agent per
#   node as local processes, a TransferPool applied with kubectl, and a transfer between two nodes through the
#   agents' sockets with xferctl. With DEMO_DECLARED=1 (the default) two more GPU nodes whose hardware reports
#   no fabric domain get a vPOD declared by kubectl for half of their GPUs, and xferctl explains a GPU pair
#   inside it and one outside it. The real kube-scheduler places a pod whose ResourceClaim selects the vPOD;
#   the agents' DRA plugins publish the devices it allocates and prepare the claim (hack/drakubelet calls them
#   as the kubelet would), and the pod-shaped client finds its socket through the claim's CDI spec.
# State lives in $DEMO_DIR (default .demo/); `hack/demo.sh down` stops every process it started.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BIN=${BIN_DIR:-$ROOT/bin}
ST=${DEMO_DIR:-$ROOT/.demo}
API_PORT=${API_PORT:-16443}
ETCD_PORT=${ETCD_PORT:-23790}
AGENT_PORT_BASE=${AGENT_PORT_BASE:-17470}
OPERATOR_PORT_BASE=${OPERATOR_PORT_BASE:-18080}
POOL=kv-cache
FIXTURES=$ROOT/topology/testdata
# node name → fixture host root
NODES=(gpu-node-a gpu-node-b rdma-node-c)
ROOTS=(ualink-vpod-node-a ualink-vpod-node-b rdma-only-node)
# Nodes of the declared vPOD (eight MI300X GPUs each, no UALink): their agents only report (no socket), after
# the others' ports. hack/failure.sh and hack/soak.sh keep the three-node layout (DEMO_DECLARED=0).
DEMO_DECLARED=${DEMO_DECLARED:-1}
DECLARED_NODES=()
if [ "$DEMO_DECLARED" = 1 ]; then DECLARED_NODES=(gpu-node-d gpu-node-e); fi
DECLARED_ROOT=mi300x-8gpu-roce
DECLARED_VPOD=ualink:5e1f0d2c-7a3b-4c8d-9e0f-1a2b3c4d5e6f/7

# shellcheck source=hack/names.sh
. hack/names.sh

step() { printf '\033[1m==> %s\033[0m\n' "$*"; }
kc() { "$BIN/kubectl" --kubeconfig "$ST/kube/kubeconfig" "$@"; }

start() { # start NAME CMD...: a background process with its PID and log under $ST
  local name=$1
  shift
  "$@" >"$ST/$name.log" 2>&1 &
  echo $! >"$ST/$name.pid"
}

wait_for() { # wait_for SECONDS WHAT CMD...: poll CMD until it succeeds or the deadline passes
  local deadline=$(($(date +%s) + $1)) what=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "demo: timed out waiting for $what" >&2
      return 1
    fi
    sleep 0.5
  done
}

down() {
  local f
  for f in "$ST"/*.pid; do
    [ -f "$f" ] || continue
    kill "$(cat "$f")" 2>/dev/null || true
  done
  for f in "$ST"/*.pid; do
    [ -f "$f" ] || continue
    for _ in $(seq 1 40); do kill -0 "$(cat "$f")" 2>/dev/null || break; sleep 0.25; done
    kill -9 "$(cat "$f")" 2>/dev/null || true
    rm -f "$f"
  done
  [ -d "$ST/kube" ] && BIN_DIR=$BIN hack/kube-down.sh "$ST/kube"
  rm -rf "$ST"
}

up() {
  for b in kubectl kube-scheduler operator agent xferctl drakubelet nodecert; do
    [ -x "$BIN/$b" ] || { echo "demo: $BIN/$b missing: run make tools build" >&2; exit 1; }
  done
  if [ -d "$ST" ]; then
    step "stopping the previous demo in $ST"
    down
  fi
  mkdir -p "$ST"

  step "starting kube-apiserver + etcd on 127.0.0.1:$API_PORT"
  API_PORT=$API_PORT ETCD_PORT=$ETCD_PORT BIN_DIR=$BIN hack/kube-up.sh "$ST/kube" >/dev/null
  export KUBECONFIG=$ST/kube/kubeconfig

  step "installing the CRDs with kubectl"
  kc apply -f config/crd/bases >/dev/null
  kc wait --for=condition=Established --timeout=60s crd/transferpools.fabricxfer.io crd/transfernodes.fabricxfer.io crd/vpodtopologies.fabricxfer.io >/dev/null

  step "creating Node objects ${NODES[*]} ${DECLARED_NODES[*]}"
  for n in "${NODES[@]}" "${DECLARED_NODES[@]}"; do
    kc apply -f - >/dev/null <<NODE
apiVersion: v1
kind: Node
metadata:
  name: $n
  labels: {fabricxfer.io/gpu-node: "true", kubernetes.io/hostname: $n}
NODE
  done

  step "creating namespace $AGENT_NS, where the operator runs every pool's agents"
  kc create namespace "$AGENT_NS" >/dev/null
  step "marking the Nodes Ready (the kubelet's part) and starting kube-scheduler"
  for n in "${NODES[@]}"; do
    kc patch node "$n" --subresource=status --type=merge -p '{"status":{"capacity":{"cpu":"8","memory":"32Gi","pods":"110"},"allocatable":{"cpu":"8","memory":"32Gi","pods":"110"},"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","message":"demo"}]}}' >/dev/null
    # The node lifecycle controller lifts the not-ready taint of a Ready node; it does not run here.
    kc taint node "$n" node.kubernetes.io/not-ready:NoSchedule- >/dev/null 2>&1 || true
  done
  start scheduler "$BIN/kube-scheduler" --kubeconfig "$KUBECONFIG" --leader-elect=false --secure-port=0
  kc apply -f config/dra/deviceclass.yaml >/dev/null

  step "starting the operator"
  start operator "$BIN/operator" --leader-elect=false --agent-namespace="$AGENT_NS" \
    --metrics-bind-address=127.0.0.1:$OPERATOR_PORT_BASE --health-probe-bind-address=127.0.0.1:$((OPERATOR_PORT_BASE + 1))
  wait_for 60 "operator health" curl -sf "http://127.0.0.1:$((OPERATOR_PORT_BASE + 1))/readyz"

  step "applying TransferPool $POOL with kubectl"
  kc apply -f - <<POOLYAML
apiVersion: fabricxfer.io/v1alpha1
kind: TransferPool
metadata: {name: $POOL, namespace: default}
spec:
  nodeSelector: {fabricxfer.io/gpu-node: "true"}
  engines: [xgmi, fabric, rdma, tcp]
  allowedNamespaces: [default]
  agent: {heartbeatSeconds: 2}
POOLYAML
  # The agents run as local processes with the admin's credentials, which no pod binds to a node, so the
  # operator would deny their certificate requests; each gets its node's certificate from the pool's CA here.
  local ca_secret
  ca_secret=$(agent_object_name default "$POOL")-tls-ca
  wait_for 60 "the pool's CA" kc -n "$AGENT_NS" get secret "$ca_secret"
  mkdir -p "$ST/tls-ca"
  for k in tls.crt ca.key ca.crt; do
    kc -n "$AGENT_NS" get secret "$ca_secret" -o "jsonpath={.data.${k//./\\.}}" | base64 -d >"$ST/tls-ca/$k"
  done
  local n
  for n in "${NODES[@]}"; do
    "$BIN/nodecert" -ca "$ST/tls-ca" -pool-namespace default -pool "$POOL" -node "$n" -out "$ST/tls/$n"
  done

  step "starting one agent per node (fixture host roots under topology/testdata)"
  local i
  for i in "${!NODES[@]}"; do
    local n=${NODES[$i]} port=$((AGENT_PORT_BASE + 3 * i))
    mkdir -p "$ST/sockets/$n"
    start "agent-$n" "$BIN/agent" run --node-name "$n" --host-root "$FIXTURES/${ROOTS[$i]}" \
      --kubeconfig "$KUBECONFIG" --pool-namespace default --pool-name "$POOL" --heartbeat 2s \
      --engines xgmi,fabric,rdma,tcp --socket-dir "$ST/sockets/$n" \
      --peer-listen "127.0.0.1:$port" --endpoint "127.0.0.1:$port" \
      --data-listen "127.0.0.1:$((port + 1))" --data-advertise "127.0.0.1:$((port + 1))" \
      --health-addr "127.0.0.1:$((port + 2))" --tls-dir "$ST/tls/$n" --allow-local --caller-host-root / \
      --dra --dra-channels 8 --cdi-dir "$ST/dra/$n/cdi" --kubelet-plugin-dir "$ST/dra/$n/plugin" --kubelet-registry-dir "$ST/dra/$n/registry"
  done
  for n in "${DECLARED_NODES[@]}"; do
    start "agent-$n" "$BIN/agent" run --node-name "$n" --host-root "$FIXTURES/$DECLARED_ROOT" \
      --kubeconfig "$KUBECONFIG" --pool-namespace default --pool-name "$POOL" --heartbeat 2s \
      --engines xgmi,fabric,rdma,tcp --report-only
  done
  for i in "${!NODES[@]}"; do
    wait_for 60 "agent ${NODES[$i]} ready" curl -sf "http://127.0.0.1:$((AGENT_PORT_BASE + 3 * i + 2))/readyz"
  done

  step "waiting for TransferPool $POOL to be Ready"
  if ! kc wait --for=condition=Ready --timeout=90s "transferpool/$POOL" >/dev/null; then
    kc get transferpool "$POOL" -o yaml >&2
    exit 1
  fi
  # The pool counts the engines its agents run: each agent's report says so once its engines are assembled
  # (the same-node engine runs on every agent that serves a socket).
  wait_for 30 "the pool counting the engines its agents run" kc wait --timeout=1s \
    --for=jsonpath='{.status.engines[?(@.name=="xgmi")].nodes}'="${#NODES[@]}" "transferpool/$POOL"
  echo "TransferPool $POOL Ready"
  echo
  kc get transferpools,transfernodes,vpodtopologies -o wide
  echo

  if [ "$DEMO_DECLARED" = 1 ]; then
    step "declaring vPOD demo-declared with kubectl: GPUs 0-3 of gpu-node-d and gpu-node-e (their hardware reports no domain)"
    kc apply -f - <<VPOD
apiVersion: fabricxfer.io/v1alpha1
kind: VPodTopology
metadata: {name: demo-declared}
spec:
  kind: ualink
  domain: $DECLARED_VPOD
  members:
  - {node: gpu-node-d, gpus: [0, 1, 2, 3]}
  - {node: gpu-node-e, gpus: [0, 1, 2, 3]}
VPOD
    wait_for 30 "both agents taking the declaration" kc wait --for=condition=Declared --timeout=1s vpodtopology/demo-declared
    for n in "${DECLARED_NODES[@]}"; do
      echo "$n GPU domains: $(kc get transfernode "$n" -o 'jsonpath={range .status.gpus[*]}{.index}={.fabric.domain}({.fabric.source}) {end}')"
    done
    step "explain: GPU memory on gpu-node-d GPU 1 -> gpu-node-e GPU 2 (inside the declared vPOD) and -> GPU 5 (outside)"
    "$BIN/xferctl" explain --kubeconfig "$KUBECONFIG" --from-gpu gpu-node-d/1 --to-gpu gpu-node-e/2
    "$BIN/xferctl" explain --kubeconfig "$KUBECONFIG" --from-gpu gpu-node-d/1 --to-gpu gpu-node-e/5
  fi

  local sock_a=$ST/sockets/gpu-node-a/$POOL/agent.sock sock_c=$ST/sockets/rdma-node-c/$POOL/agent.sock
  step "registering 64 MiB of host memory on gpu-node-a (segment kv-a) and on rdma-node-c (segment kv-c)"
  start register-a "$BIN/xferctl" register --socket "$sock_a" --segment kv-a --size 64Mi
  start register-c "$BIN/xferctl" register --socket "$sock_c" --segment kv-c --size 64Mi
  wait_for 30 "segment kv-a" grep -q "registered" "$ST/register-a.log"
  wait_for 30 "segment kv-c" grep -q "registered" "$ST/register-c.log"
  sed 's/^/  /' "$ST/register-a.log" "$ST/register-c.log"
  step "explain: which engine carries gpu-node-a/kv-a -> rdma-node-c/kv-c, and why not the others"
  "$BIN/xferctl" explain --socket "$sock_a" --from gpu-node-a/kv-a --to rdma-node-c/kv-c
  step "transfer: 64 MiB written from gpu-node-a into rdma-node-c/kv-c, read back and checksummed"
  "$BIN/xferctl" transfer --socket "$sock_a" --to rdma-node-c/kv-c --size 64Mi --verify
  step "transfer: 64 MiB read from rdma-node-c/kv-c into gpu-node-a"
  "$BIN/xferctl" transfer --socket "$sock_a" --to rdma-node-c/kv-c --size 64Mi --read

  step "DRA: a decode pod claims a transfer channel inside the vPOD; kube-scheduler places it, its node's agent prepares the claim"
  local vpod=ualink:1c9e2f4a-6b7d-4e11-9a2b-3c4d5e6f7081/1
  kc apply -f - >/dev/null <<CLAIM
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: kv-decode, namespace: default}
spec:
  devices:
    requests:
    - name: socket
      exactly:
        deviceClassName: fabricxfer.io
        selectors:
        - cel: {expression: 'device.attributes["fabricxfer.io"].pool == "$POOL" && device.attributes["fabricxfer.io"].vpod == "$vpod"'}
---
apiVersion: v1
kind: Pod
metadata: {name: decode, namespace: default}
spec:
  automountServiceAccountToken: false
  resourceClaims: [{name: fabricxfer, resourceClaimName: kv-decode}]
  containers:
  - name: decode
    image: registry.example/decode:demo
    resources: {claims: [{name: fabricxfer}]}
CLAIM
  local nodes=()
  for n in "${NODES[@]}"; do nodes+=(-node "$n=$ST/dra/$n/plugin/dra.sock,$ST/dra/$n/cdi"); done
  "$BIN/drakubelet" -kubeconfig "$KUBECONFIG" -pod default/decode "${nodes[@]}" -- \
    "$BIN/xferctl" transfer --to rdma-node-c/kv-c --size 1Mi --verify
  echo
  echo "Demo running. KUBECONFIG=$KUBECONFIG; logs in $ST/*.log. Stop everything with: make demo-down"
}

case ${1:-up} in
up) up ;;
down) down ;;
*)
  echo "usage: hack/demo.sh up|down" >&2
  exit 2
  ;;
esac
