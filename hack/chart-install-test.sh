#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# hack/chart-install-test.sh installs fabricxfer on a throwaway control plane (etcd + kube-apiserver on
# loopback, no scheduler, no kubelet) in both supported ways, and checks what lands in the cluster:
#   1. helm install with default values: CRDs established, operator Deployment, RBAC (rules as in
#      config/rbac/role.yaml), metrics Service, the agents' FlowSchema in force; a sample TransferPool is accepted;
#      when an operator binary is at hand (bin/operator or OPERATOR_BIN), it runs as the chart's ServiceAccount
#      with the Deployment's arguments, takes the leader lease and makes the sample pool's agent DaemonSet;
#   2. helm upgrade with defaultPool.enabled=true creates that pool;
#   3. helm uninstall removes the release (the agents' FlowSchema too) but keeps the CRDs and the pools;
#   4. with no CRDs in the cluster, helm install --set defaultPool.enabled=true is refused and creates nothing;
#      installed first and enabled by an upgrade, the pool is created, updated and removed with the release;
#   5. kubectl apply -f dist/install.yaml on the cleaned cluster.
# Nothing schedules pods here, so it never waits for the operator to run (no --wait).
# Needs bin/{etcd,kube-apiserver,kubectl,helm} (make tools), openssl, curl and awk. Ports: API_PORT (17443),
# ETCD_PORT (24790), ETCD_PEER_PORT (24800). Everything it starts is stopped on exit, whatever happened.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=hack/names.sh
. hack/names.sh
repo=$PWD

BIN=${BIN_DIR:-$repo/bin}
API_PORT=${API_PORT:-17443}
ETCD_PORT=${ETCD_PORT:-24790}
ETCD_PEER_PORT=${ETCD_PEER_PORT:-24800}
NS=fabricxfer-system
CRDS=(transferpools.fabricxfer.io transfernodes.fabricxfer.io vpodtopologies.fabricxfer.io)

for tool in etcd kube-apiserver kubectl helm; do
  [ -x "$BIN/$tool" ] || { echo "chart-install-test: $BIN/$tool not found; run make tools" >&2; exit 2; }
done
for port in "$API_PORT" "$ETCD_PORT" "$ETCD_PEER_PORT"; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "chart-install-test: port $port is in use; set API_PORT/ETCD_PORT/ETCD_PEER_PORT" >&2
    exit 2
  fi
done

state=$(mktemp -d "${TMPDIR:-/tmp}/fabricxfer-chart-install.XXXXXX")
pids=()
# stop ends each process this script started: TERM, up to 15 s to exit, then KILL.
stop() {
  local pid
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null || continue
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
}
cleanup() {
  local rc=$?
  # Reverse order: the API server before etcd.
  local reversed=() i
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do reversed+=("${pids[$i]}"); done
  pids=("${reversed[@]}")
  stop
  if [ "$rc" -ne 0 ] && [ -f "$state/apiserver.log" ]; then
    echo "--- last lines of the kube-apiserver log" >&2
    tail -15 "$state/apiserver.log" >&2
  fi
  rm -rf "$state"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

elapsed() { awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
step() { printf '\n== %s\n' "$*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }
ok() { echo "ok: $*"; }

step "control plane: etcd :$ETCD_PORT, kube-apiserver :$API_PORT"
started=$(date +%s.%N)
pki=$state/pki
mkdir -p "$pki" "$state/etcd"
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=local-ca -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj /CN=kube-apiserver -keyout "$pki/apiserver.key" -out "$pki/apiserver.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >"$pki/san.cnf"
openssl x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 1 \
  -extfile "$pki/san.cnf" -out "$pki/apiserver.crt" 2>/dev/null
openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
token=$(openssl rand -hex 16)
echo "$token,admin,admin,\"system:masters\"" >"$pki/tokens.csv"

"$BIN/etcd" --name local --data-dir "$state/etcd" --unsafe-no-fsync \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster "local=http://127.0.0.1:$ETCD_PEER_PORT" >"$state/etcd.log" 2>&1 &
pids+=($!)
# --allow-privileged: agent DaemonSets run privileged, which the API server refuses without it.
"$BIN/kube-apiserver" --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
  --bind-address=127.0.0.1 --secure-port="$API_PORT" \
  --advertise-address=127.0.0.1 --endpoint-reconciler-type=none \
  --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" --cert-dir="$pki" \
  --token-auth-file="$pki/tokens.csv" --authorization-mode=RBAC --allow-privileged=true \
  --service-account-issuer=https://kubernetes.default.svc \
  --service-account-key-file="$pki/sa.key" --service-account-signing-key-file="$pki/sa.key" \
  --service-cluster-ip-range=10.0.0.0/24 >"$state/apiserver.log" 2>&1 &
pids+=($!)

export KUBECONFIG=$state/kubeconfig
cat >"$KUBECONFIG" <<KC
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "https://127.0.0.1:$API_PORT", certificate-authority: "$pki/ca.crt"}}]
users: [{name: admin, user: {token: "$token"}}]
contexts: [{name: local, context: {cluster: local, user: admin, namespace: default}}]
current-context: local
KC
chmod 600 "$KUBECONFIG"
# helm keeps its cache and config under these; keep them in the throwaway state.
# kubectl and helm cache discovery under KUBECACHEDIR (default ~/.kube/cache); keep that in the state too.
export KUBECACHEDIR=$state/kube-cache
export HELM_CACHE_HOME=$state/helm/cache HELM_CONFIG_HOME=$state/helm/config HELM_DATA_HOME=$state/helm/data

ready=0
for _ in $(seq 1 120); do
  kill -0 "${pids[1]}" 2>/dev/null || fail "kube-apiserver exited"
  if curl -sf --max-time 2 --cacert "$pki/ca.crt" -H "Authorization: Bearer $token" \
    "https://127.0.0.1:$API_PORT/readyz" >/dev/null; then
    ready=1
    break
  fi
  sleep 0.5
done
[ "$ready" = 1 ] || fail "kube-apiserver not ready after 60 s"
ok "kube-apiserver ready in $(elapsed) s"

kubectl() { "$BIN/kubectl" "$@"; }
helm() { "$BIN/helm" "$@"; }

# expect_crds_established fails unless every fabricxfer CRD exists and is Established within 60 s. The API
# server marks a CRD Established in a second step, after it accepted the CRD's names; on failure each CRD's
# conditions and the API server's lines about it say which step did not happen (one CI run waited 30 s in vain
# for transfernodes after the delete and apply below, with nothing printed to tell why).
expect_crds_established() {
  kubectl wait --for=condition=Established --timeout=60s "${CRDS[@]/#/crd/}" >/dev/null && {
    ok "CRDs established: ${CRDS[*]}"
    return
  }
  describe_crds
  fail "CRDs not established in 60 s"
}
# wait_crds_served waits until the API server lists the CRDs' objects. A CRD's storage starts after it is
# Established; deleted before that, its finalizer's first list fails ("storage is (re)initializing") and is
# retried with a backoff that doubles each time, which once outlasted the 120 s wait for the deletion below.
wait_crds_served() {
  local kinds i
  kinds=$(IFS=,; echo "${CRDS[*]}")
  for i in $(seq 120); do
    kubectl get "$kinds" -A >/dev/null 2>&1 && return
    sleep 0.5
  done
  describe_crds
  fail "the API server did not list the CRDs' objects within 60 s"
}
# describe_crds prints, for a CRD that did not do what was waited for, its identity, finalizers, deletion and
# conditions, and the API server's last lines about it.
describe_crds() {
  local crd
  for crd in "${CRDS[@]}"; do
    kubectl get crd "$crd" -o jsonpath='{.metadata.name} uid={.metadata.uid} finalizers={.metadata.finalizers} deleting={.metadata.deletionTimestamp}{"\n"}{range .status.conditions[*]}  {.type}={.status} {.reason} {.lastTransitionTime}: {.message}{"\n"}{end}' >&2 ||
      true
    grep -F "$crd" "$state/apiserver.log" | tail -5 >&2 || true
  done
}
# expect_rules_as_generated compares the operator ClusterRole in the cluster with config/rbac/role.yaml.
expect_rules_as_generated() {
  local live want
  live=$(kubectl get clusterrole "$1" -o jsonpath='{.rules}')
  # role.yaml holds the ClusterRole, then the Role of the agents' namespace.
  want=$(awk '/^---$/ { n++; next } n == 1' config/rbac/role.yaml | kubectl create --dry-run=client -f - -o jsonpath='{.rules}')
  [ -n "$live" ] && [ "$live" = "$want" ] || fail "ClusterRole $1 rules differ from config/rbac/role.yaml"
  ok "ClusterRole $1 has the rules of config/rbac/role.yaml"
}

step "helm install (default values)"
helm install fabricxfer charts/fabricxfer -n "$NS" --create-namespace --timeout 60s
expect_crds_established
kubectl -n "$NS" get deployment fabricxfer-operator -o jsonpath='{.spec.replicas} replicas of {.spec.template.spec.containers[0].image}{"\n"}'
[ "$(kubectl -n "$NS" get deployment fabricxfer-operator -o jsonpath='{.spec.replicas}')" = 2 ] ||
  fail "operator Deployment does not ask for 2 replicas"
ok "Deployment $NS/fabricxfer-operator exists"
kubectl -n "$NS" get serviceaccount/fabricxfer-operator service/fabricxfer-operator-metrics \
  role/fabricxfer-operator-leader-election rolebinding/fabricxfer-operator-leader-election \
  poddisruptionbudget/fabricxfer-operator >/dev/null || fail "namespaced objects missing"
kubectl get clusterrolebinding/fabricxfer-operator >/dev/null || fail "ClusterRoleBinding missing"
ok "ServiceAccount, metrics Service, leader-election Role/RoleBinding, PDB, ClusterRoleBinding exist"
# The API server marks a FlowSchema Dangling=False once it has the priority level it names.
kubectl wait --for=condition=Dangling=False --timeout=30s flowschema/fabricxfer-agents flowschema/fabricxfer-agent-leases \
  flowschema/fabricxfer-operator >/dev/null ||
  fail "the FlowSchemas fabricxfer-agents, fabricxfer-agent-leases and fabricxfer-operator are missing or their priority level is"
ok "the agents' FlowSchemas and their PriorityLevelConfiguration fabricxfer-agents are in force, and the operator's"
# Where the API server puts each identity's requests, from its answer to one made as it (the priority level's
# UID in X-Kubernetes-PF-PriorityLevel-UID): an agent's ServiceAccount in the agents' level, the operator's,
# which shares their namespace, in workload-low as it would be without these schemas.
level_uid() {
  curl -s --max-time 5 -o /dev/null -D - --cacert "$pki/ca.crt" -H "Authorization: Bearer $token" -H "Impersonate-User: $1" \
    "https://127.0.0.1:$API_PORT/api/v1/namespaces/$NS/serviceaccounts" |
    tr -d '\r' | awk -F': ' 'tolower($1) == "x-kubernetes-pf-prioritylevel-uid" { print $2 }'
}
for who in fabricxfer-agent-sample:fabricxfer-agents fabricxfer-operator:workload-low; do
  sa=${who%%:*} level=${who#*:}
  got=$(level_uid "system:serviceaccount:$NS:$sa")
  want=$(kubectl get prioritylevelconfiguration "$level" -o jsonpath='{.metadata.uid}')
  [ -n "$want" ] && [ "$got" = "$want" ] || fail "requests of ServiceAccount $NS/$sa went to priority level UID '$got', not $level ($want)"
done
ok "an agent's requests go to priority level fabricxfer-agents, the operator's to workload-low"
# The level borrows no seats (borrowingLimitPercent 0): the API server's upper limit for it is its nominal one,
# so a start-up of agents never runs more requests at once than that, whatever other levels leave idle.
seats=
for _ in $(seq 1 60); do
  seats=$({ kubectl get --raw /metrics 2>/dev/null || true; } | awk -F'[ ]' '
    /^apiserver_flowcontrol_nominal_limit_seats\{priority_level="fabricxfer-agents"\}/ { n = $2 }
    /^apiserver_flowcontrol_upper_limit_seats\{priority_level="fabricxfer-agents"\}/ { u = $2 }
    END { if (n != "" && u != "") print n, u }')
  [ -n "$seats" ] && break
  sleep 0.5
done
read -r nominal upper <<<"${seats:-? ?}"
[ "$nominal" != "?" ] && [ "$nominal" -gt 0 ] && [ "$upper" = "$nominal" ] ||
  fail "the agents' priority level may use $upper seats, not only its nominal $nominal (or the API server does not report them)"
ok "the agents' priority level is held to its $nominal nominal seats"
expect_rules_as_generated fabricxfer-operator
operator_sa="system:serviceaccount:$NS:fabricxfer-operator"
kubectl auth can-i create daemonsets.apps -n "$NS" --as="$operator_sa" >/dev/null ||
  fail "the operator's ServiceAccount may not create DaemonSets in $NS"
for denied in "create daemonsets.apps -n default" "get secrets -n default" "list secrets -A" "escalate clusterroles" \
  "bind clusterroles/cluster-admin" "create clusterroles"; do
  # shellcheck disable=SC2086 # the question is meant to split
  if kubectl auth can-i $denied --as="$operator_sa" >/dev/null 2>&1; then fail "the operator's ServiceAccount may $denied"; fi
done
kubectl auth can-i bind clusterroles/fabricxfer-agent --as="$operator_sa" >/dev/null ||
  fail "the operator's ServiceAccount may not bind the agents' ClusterRole"
ok "the operator's ServiceAccount may create DaemonSets in $NS and bind fabricxfer-agent, and no more (no escalate, no Secret or DaemonSet elsewhere)"
kubectl apply -f config/samples/fabricxfer_v1alpha1_transferpool.yaml
kubectl get transferpools -A

step "the operator runs with the chart's ServiceAccount and arguments"
OPERATOR_BIN=${OPERATOR_BIN:-$BIN/operator}
if [ ! -x "$OPERATOR_BIN" ]; then
  echo "skipped: no operator binary at $OPERATOR_BIN (make build, or set OPERATOR_BIN)"
else
  # The Deployment's own arguments, with the metrics and health listeners off: this runs on a shared host.
  mapfile -t args < <(kubectl -n "$NS" get deployment fabricxfer-operator \
    -o go-template='{{range (index .spec.template.spec.containers 0).args}}{{.}}{{"\n"}}{{end}}')
  sa_token=$(kubectl -n "$NS" create token fabricxfer-operator --duration=10m)
  sed "s/token: \"$token\"/token: \"$sa_token\"/" "$KUBECONFIG" >"$state/operator.kubeconfig"
  KUBECONFIG=$state/operator.kubeconfig "$OPERATOR_BIN" "${args[@]}" --metrics-bind-address=0 \
    --health-probe-bind-address=0 >"$state/operator.log" 2>&1 &
  pids+=($!)
  operator_pid=$!
  holder=""
  sample_agents=$(agent_object_name default "$(kubectl create --dry-run=client -f config/samples/fabricxfer_v1alpha1_transferpool.yaml -o jsonpath='{.metadata.name}')")
  deadline=$((SECONDS + 60))
  while [ "$SECONDS" -lt "$deadline" ]; do
    kill -0 "$operator_pid" 2>/dev/null || { tail -5 "$state/operator.log" >&2; fail "operator exited"; }
    holder=$(kubectl -n "$NS" get lease fabricxfer-operator.fabricxfer.io -o jsonpath='{.spec.holderIdentity}' 2>/dev/null || true)
    [ -n "$holder" ] && kubectl -n "$NS" get daemonset "$sample_agents" >/dev/null 2>&1 && break
    sleep 0.5
  done
  [ -n "$holder" ] || { tail -5 "$state/operator.log" >&2; fail "operator did not take the leader lease in 60 s"; }
  ok "operator holds lease $NS/fabricxfer-operator.fabricxfer.io ($holder)"
  kubectl -n "$NS" get daemonset "$sample_agents" >/dev/null 2>&1 ||
    { grep -m3 error "$state/operator.log" | cut -c1-400 >&2; fail "operator made no agent DaemonSet for the sample pool in 60 s"; }
  ok "operator created DaemonSet $NS/$sample_agents for the sample pool, none in the pool's namespace"
  [ -z "$(kubectl -n default get daemonsets -o name)" ] || fail "a DaemonSet in the sample pool's namespace"
  agent_sa="system:serviceaccount:$NS:$sample_agents"
  for who in "$operator_sa" "$agent_sa"; do
    echo "kubectl auth can-i --list -n default --as=$who"
    kubectl auth can-i --list -n default --as="$who" | sed 's/^/  /'
  done
  for denied in "get secrets -n $NS" "get secrets -n default" "list secrets -A" "create pods -n $NS" \
    "update leases -n kube-node-lease" "get transferpools.fabricxfer.io/other -n default"; do
    # shellcheck disable=SC2086
    if kubectl auth can-i $denied --as="$agent_sa" >/dev/null 2>&1; then fail "the sample pool's agents may $denied"; fi
  done
  kubectl auth can-i create leases -n default --as="$agent_sa" >/dev/null || fail "the sample pool's agents may not renew Leases"
  ok "the sample pool's agents read no Secret, create no pod, and renew Leases only in the pool's namespace"
  if grep -m3 -i "forbidden" "$state/operator.log" | cut -c1-400 >&2; then fail "the operator was refused something"; fi
  ok "no RBAC refusal in the operator log"
  kill "$operator_pid"
  for _ in $(seq 1 60); do kill -0 "$operator_pid" 2>/dev/null || break; sleep 0.25; done
  kill -9 "$operator_pid" 2>/dev/null || true
fi

step "helm upgrade --set defaultPool.enabled=true"
helm upgrade fabricxfer charts/fabricxfer -n "$NS" --set defaultPool.enabled=true --timeout 60s | sed -n '1,6p'
kubectl -n "$NS" get transferpool default >/dev/null || fail "defaultPool not created by the upgrade"
ok "TransferPool $NS/default created by the upgrade"

step "helm uninstall keeps the CRDs"
helm uninstall fabricxfer -n "$NS" --timeout 60s
for crd in "${CRDS[@]}"; do kubectl get crd "$crd" >/dev/null 2>&1 || fail "CRD $crd was removed by uninstall"; done
ok "CRDs kept after uninstall"
kubectl -n default get transferpool kv-cache >/dev/null || fail "user's TransferPool lost with the release"
ok "TransferPool default/kv-cache (not the release's) still there"
if kubectl -n "$NS" get deployment fabricxfer-operator >/dev/null 2>&1; then fail "operator Deployment left behind"; fi
if kubectl -n "$NS" get transferpool default >/dev/null 2>&1; then fail "the release's TransferPool left behind"; fi
ok "operator Deployment and the release's TransferPool removed"
for obj in flowschema/fabricxfer-agents flowschema/fabricxfer-agent-leases flowschema/fabricxfer-operator \
  prioritylevelconfiguration/fabricxfer-agents; do
  if kubectl get "$obj" >/dev/null 2>&1; then fail "the agents' $obj left behind by uninstall"; fi
done
ok "the agents' FlowSchemas and PriorityLevelConfiguration removed"

step "helm install --set defaultPool.enabled=true into a cluster without the CRDs is refused"
# No operator runs now to remove its finalizer from the pools it reconciled; clear it, or deletion waits forever.
for pool in $(kubectl get transferpools -A -o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name}{" "}{end}'); do
  kubectl -n "${pool%/*}" patch transferpool "${pool#*/}" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null
done
kubectl delete transferpools --all -A --timeout=30s >/dev/null
wait_crds_served
kubectl delete crd "${CRDS[@]}" --timeout=60s >/dev/null
if helm install fabricxfer charts/fabricxfer -n "$NS" --set defaultPool.enabled=true --timeout 60s \
  >"$state/refused.log" 2>&1; then
  fail "helm install with defaultPool and no CRDs succeeded; the chart's note says it cannot"
fi
grep -q "ensure CRDs are installed first" "$state/refused.log" || { cat "$state/refused.log" >&2; fail "unexpected error"; }
sed 's/^/  /' "$state/refused.log"
[ -z "$(helm list -a -q -n "$NS")" ] || fail "the refused install left a release behind"
if kubectl get crd "${CRDS[0]}" >/dev/null 2>&1; then fail "the refused install created CRDs"; fi
if kubectl -n "$NS" get deployment fabricxfer-operator >/dev/null 2>&1; then fail "the refused install created the Deployment"; fi
ok "refused with Helm's 'ensure CRDs are installed first', nothing created"

step "install, then helm upgrade --reuse-values --set defaultPool.enabled=true, then change the pool"
helm install fabricxfer charts/fabricxfer -n "$NS" --timeout 60s >/dev/null
helm upgrade fabricxfer charts/fabricxfer -n "$NS" --reuse-values --set defaultPool.enabled=true --timeout 60s >/dev/null
kubectl -n "$NS" get transferpool default >/dev/null || fail "defaultPool not created by the upgrade"
helm upgrade fabricxfer charts/fabricxfer -n "$NS" --reuse-values --set 'defaultPool.spec.allowedNamespaces={inference}' \
  --timeout 60s >/dev/null
[ "$(kubectl -n "$NS" get transferpool default -o jsonpath='{.spec.allowedNamespaces}')" = '["inference"]' ] ||
  fail "the next upgrade did not update the pool"
ok "TransferPool $NS/default created, then updated by helm upgrade"
helm uninstall fabricxfer -n "$NS" --timeout 60s >/dev/null
if kubectl -n "$NS" get transferpool default >/dev/null 2>&1; then fail "the release's pool left behind by uninstall"; fi
ok "uninstall removed the release's pool and kept the CRDs"
for crd in "${CRDS[@]}"; do kubectl get crd "$crd" >/dev/null 2>&1 || fail "CRD $crd was removed by uninstall"; done

step "kubectl apply -f dist/install.yaml"
# The CRDs go first, and must be gone before the apply: a CRD still being deleted would take the apply as a
# change to itself and then vanish under it. The API server's finalizer deletes a CRD's objects before the CRD;
# one CI run's delete of transfernodes was still waiting after 60 s with nothing printed to tell why, so a CRD
# that outlives the wait prints its finalizers and conditions and the API server's lines about it.
wait_crds_served
kubectl delete crd "${CRDS[@]}" --wait=false >/dev/null
if ! kubectl wait --for=delete --timeout=120s "${CRDS[@]/#/crd/}" >/dev/null 2>&1; then
  describe_crds
  fail "CRDs not deleted within 120 s"
fi
kubectl apply -f dist/install.yaml
expect_crds_established
kubectl -n "$NS" get deployment fabricxfer-operator >/dev/null || fail "dist/install.yaml made no operator Deployment"
expect_rules_as_generated fabricxfer-operator
kubectl apply -f config/samples/fabricxfer_v1alpha1_transferpool.yaml >/dev/null
kubectl get transferpools -A
ok "dist/install.yaml applied; a TransferPool is accepted"
kubectl apply --dry-run=server -f dist/install.yaml >/dev/null || fail "re-applying dist/install.yaml (server dry-run)"
ok "re-applying dist/install.yaml is clean (server-side dry-run)"

printf '\nchart-install-test: all checks passed in %s s\n' "$(elapsed)"
