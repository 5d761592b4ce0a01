#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# hack/kube-up.sh STATE_DIR starts a local control plane on loopback for the demo and end-to-end tests: etcd,
# kube-apiserver and, when built, kube-controller-manager (garbage collection of owned objects). There is no
# scheduler and no kubelet: agents run as local processes instead of DaemonSet pods.
# Writes STATE_DIR/kubeconfig; hack/kube-down.sh STATE_DIR stops it. Ports: API_PORT (16443), ETCD_PORT (23790).
# Clients authenticate with static tokens (STATE_DIR/pki/tokens.csv; the first line is the kubeconfig's admin in
# system:masters). EXTRA_TOKENS adds lines to it, one per line, in its format token,user,uid,"group1,group2":
# hack/scale.sh gives its simulated agents the identity of the pool's agent ServiceAccount that way.
# APISERVER_FLAGS are added to kube-apiserver's command line (e.g. "--max-requests-inflight=20").
set -euo pipefail
BIN=${BIN_DIR:-$PWD/bin}
ST=${1:?usage: hack/kube-up.sh STATE_DIR}
mkdir -p "$ST" && ST=$(cd "$ST" && pwd)
ETCD_PORT=${ETCD_PORT:-23790}
ETCD_PEER=${ETCD_PEER:-$((ETCD_PORT + 10))}
API_PORT=${API_PORT:-16443}
P=$ST/pki
mkdir -p "$P" "$ST/etcd-data"

for b in etcd kube-apiserver; do
  [ -x "$BIN/$b" ] || { echo "kube-up: $BIN/$b missing: run make tools" >&2; exit 1; }
done
if [ ! -f "$P/tokens.csv" ]; then
  openssl req -x509 -newkey rsa:2048 -nodes -days 365 -subj /CN=fabricxfer-local-ca -keyout "$P/ca.key" -out "$P/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj /CN=kube-apiserver -keyout "$P/apiserver.key" -out "$P/apiserver.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >"$P/san.cnf"
  openssl x509 -req -in "$P/apiserver.csr" -CA "$P/ca.crt" -CAkey "$P/ca.key" -CAcreateserial -days 365 \
    -extfile "$P/san.cnf" -out "$P/apiserver.crt" 2>/dev/null
  openssl genrsa -out "$P/sa.key" 2048 2>/dev/null
  echo "$(openssl rand -hex 16),admin,admin,\"system:masters\"" >"$P/tokens.csv"
fi
if [ -n "${EXTRA_TOKENS:-}" ]; then
  while IFS= read -r line; do
    [ -z "$line" ] || grep -qxF -- "$line" "$P/tokens.csv" || echo "$line" >>"$P/tokens.csv"
  done <<<"$EXTRA_TOKENS"
fi
TOKEN=$(head -1 "$P/tokens.csv" | cut -d, -f1)

start() { # start NAME CMD...: run in the background, recording the PID and a log
  local name=$1
  shift
  "$@" >"$ST/$name.log" 2>&1 &
  echo $! >"$ST/$name.pid"
}

start etcd "$BIN/etcd" --name local --data-dir "$ST/etcd-data" --unsafe-no-fsync \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_PEER" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER" \
  --initial-cluster "local=http://127.0.0.1:$ETCD_PEER"
# kube-apiserver gives up on an etcd that is slow to start (a loaded machine), so wait for etcd first.
for i in $(seq 1 120); do
  curl -sf --max-time 2 "http://127.0.0.1:$ETCD_PORT/health" | grep -q '"health":"true"' && break
  if ! kill -0 "$(cat "$ST/etcd.pid")" 2>/dev/null || [ "$i" = 120 ]; then
    echo "kube-up: etcd did not become healthy on 127.0.0.1:$ETCD_PORT; see $ST/etcd.log" >&2
    tail -5 "$ST/etcd.log" >&2
    exit 1
  fi
  sleep 0.25
done
# shellcheck disable=SC2086 # APISERVER_FLAGS is a list of flags
start apiserver "$BIN/kube-apiserver" --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
  --bind-address=127.0.0.1 --secure-port="$API_PORT" \
  --advertise-address=127.0.0.1 --endpoint-reconciler-type=none \
  --tls-cert-file="$P/apiserver.crt" --tls-private-key-file="$P/apiserver.key" --cert-dir="$P" \
  --token-auth-file="$P/tokens.csv" --authorization-mode=RBAC \
  --service-account-issuer=https://kubernetes.default.svc \
  --service-account-key-file="$P/sa.key" --service-account-signing-key-file="$P/sa.key" \
  --service-cluster-ip-range=10.0.0.0/24 --allow-privileged=true ${APISERVER_FLAGS:-}

cat >"$ST/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "https://127.0.0.1:$API_PORT", certificate-authority: "$P/ca.crt"}}]
users: [{name: admin, user: {token: "$TOKEN"}}]
contexts: [{name: local, context: {cluster: local, user: admin, namespace: default}}]
current-context: local
KC

for _ in $(seq 1 240); do
  if ! kill -0 "$(cat "$ST/apiserver.pid")" 2>/dev/null; then
    echo "kube-up: kube-apiserver exited:" >&2
    tail -5 "$ST/apiserver.log" >&2
    exit 1
  fi
  if curl -sf --max-time 2 --cacert "$P/ca.crt" -H "Authorization: Bearer $TOKEN" "https://127.0.0.1:$API_PORT/readyz" >/dev/null; then
    if [ -x "$BIN/kube-controller-manager" ]; then
      # No ttl controller: it annotates every Node for kubelets, which these control planes do not run, and at
      # 20 requests a second it patched make scale's 1,000 Nodes all through the measurement (426 writes).
      start controller-manager "$BIN/kube-controller-manager" --kubeconfig="$ST/kubeconfig" --leader-elect=false \
        --secure-port=0 --service-account-private-key-file="$P/sa.key" --root-ca-file="$P/ca.crt" \
        --controllers='*,-nodeipam,-nodelifecycle,-ttl,-daemonset,-deployment,-replicaset,-statefulset,-job,-cronjob'
    fi
    echo "export KUBECONFIG=$ST/kubeconfig"
    exit 0
  fi
  sleep 0.25
done
echo "kube-up: kube-apiserver not ready after 60 s; see $ST/apiserver.log" >&2
exit 1
