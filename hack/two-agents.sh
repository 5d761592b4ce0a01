#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# hack/two-agents.sh up|down|status|restart — two agents on one machine as two nodes of one pool, without Kubernetes
# and without Go: node-a and node-b run `agent standalone` with their own node names, sockets and ports, each
# other as static peers (--peers), and the pool's certificates written by `agent certs` (the operator's own
# PKI), so everything between them crosses the agent-to-agent channel and the tcp engine over loopback, as
# between two machines. On a GPU machine both see the same GPUs; GPU memory moves between them through the
# tcp engine's staging (or a faster engine where one claims the pair).
#
# Needs only the prebuilt agent binary: AGENT=/path/to/agent (default bin/agent; `go build -o bin/agent
# ./cmd/agent` where Go is). State lives in $TWO_AGENTS_DIR (default /tmp/fabricxfer-two-agents):
#   a/kv/agent.sock, b/kv/agent.sock   the sockets (pool "kv" in namespace "default")
#   tls/                               the pool's certificates (tls.crt, tls.key, ca.crt)
#   a.log, b.log, a.pid, b.pid         the agents' logs and process ids
#   env                                NODE_A, NODE_B, SOCK_A, SOCK_B, for scripts to source
# Ports: $PORT_BASE (default 17570) and the next two for node-a (peer gRPC, tcp data, unused), +10 for node-b.
# Extra agent flags: AGENT_ARGS (both), e.g. AGENT_ARGS="--tcp-staging-bytes 134217728". TRACE_DIR: each agent
# writes an execution trace of its run there (a.trace, b.trace; hack/trace-tcp.py reads their staged transfers);
# PROFILE_DIR: a CPU profile of its run (a.pprof, b.pprof).
# `restart a|b [TERM|KILL]` stops one agent (TERM by default: it ends its sessions as on a node's shutdown; KILL:
# as a crash) and starts it again with the same flags, the certificates kept, its log before that kept as a.log.N:
# what a client sees of its agent's restart, or of a peer's.
set -euo pipefail

AGENT=${AGENT:-bin/agent}
DIR=${TWO_AGENTS_DIR:-/tmp/fabricxfer-two-agents}
PORT_BASE=${PORT_BASE:-17570}
HOST=127.0.0.1
NODE_A=${NODE_A:-node-a}
NODE_B=${NODE_B:-node-b}

die() { echo "two-agents: $*" >&2; exit 1; }

# alive DIR/x.pid: the process recorded there runs.
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start_one() { # name node peer-port data-port other-node other-peer-port
  local name=$1 node=$2 pport=$3 dport=$4 other=$5 opport=$6
  mkdir -p "$DIR/$name"
  # shellcheck disable=SC2086 # AGENT_ARGS is a list of flags
  local trace=()
  if [ -n "${TRACE_DIR:-}" ]; then mkdir -p "$TRACE_DIR"; trace=(--trace "$TRACE_DIR/$name.trace"); fi
  if [ -n "${PROFILE_DIR:-}" ]; then mkdir -p "$PROFILE_DIR"; trace+=(--cpu-profile "$PROFILE_DIR/$name.pprof"); fi
  "$AGENT" standalone --node-name "$node" --socket-dir "$DIR/$name" --pool-namespace default --pool-name kv \
    --tls-dir "$DIR/tls" --peer-listen "$HOST:$pport" --endpoint "$HOST:$pport" \
    --data-listen "$HOST:$dport" --data-advertise "$HOST:$dport" --peers "$other=$HOST:$opport" \
    "${trace[@]}" ${AGENT_ARGS:-} >"$DIR/$name.log" 2>&1 &
  echo $! >"$DIR/$name.pid"
}

wait_socket() { # name
  local sock="$DIR/$1/kv/agent.sock" fd="$DIR/$1/kv/agent.fd.sock" i
  for i in $(seq 1 600); do
    if [ -S "$sock" ] && [ -S "$fd" ]; then return 0; fi
    alive "$DIR/$1.pid" || { tail -n 30 "$DIR/$1.log" >&2; die "agent $1 exited before serving (log $DIR/$1.log)"; }
    sleep 0.1
  done
  die "agent $1 did not open its socket within 60 s (log $DIR/$1.log)"
}

start_node() { # a|b
  case $1 in
  a) start_one a "$NODE_A" "$PORT_BASE" $((PORT_BASE + 1)) "$NODE_B" $((PORT_BASE + 10)) ;;
  b) start_one b "$NODE_B" $((PORT_BASE + 10)) $((PORT_BASE + 11)) "$NODE_A" "$PORT_BASE" ;;
  esac
}

stop_one() { # name signal: the agent stopped with signal, waited for up to 10 s, then killed
  local pid
  alive "$DIR/$1.pid" || { rm -f "$DIR/$1.pid"; return 0; }
  pid=$(cat "$DIR/$1.pid")
  kill -"$2" "$pid"
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; fi
  rm -f "$DIR/$1.pid"
}

restart() { # a|b [TERM|KILL]
  local name=${1:-} sig=${2:-TERM} n=1
  case $name in a | b) ;; *) die "usage: hack/two-agents.sh restart a|b [TERM|KILL]" ;; esac
  case $sig in TERM | KILL) ;; *) die "restart stops an agent with TERM or KILL, not $sig" ;; esac
  [ -f "$DIR/tls/ca.crt" ] || die "not up in $DIR (hack/two-agents.sh up first)"
  stop_one "$name" "$sig"
  # A killed agent leaves its sockets: the new one's are waited for, not those.
  rm -f "$DIR/$name/kv/agent.sock" "$DIR/$name/kv/agent.fd.sock"
  while [ -e "$DIR/$name.log.$n" ]; do n=$((n + 1)); done
  if [ -f "$DIR/$name.log" ]; then mv "$DIR/$name.log" "$DIR/$name.log.$n"; fi
  start_node "$name"
  wait_socket "$name"
  echo "agent $name restarted after $sig (log $DIR/$name.log; the one before, $DIR/$name.log.$n)"
}

up() {
  [ -x "$AGENT" ] || die "no agent binary at $AGENT (set AGENT=/path/to/agent)"
  if alive "$DIR/a.pid" || alive "$DIR/b.pid"; then die "already up in $DIR (hack/two-agents.sh down first)"; fi
  rm -rf "$DIR"
  mkdir -p "$DIR"
  "$AGENT" certs --dir "$DIR/tls" --pool-namespace default --pool-name kv --validity 24h >/dev/null
  start_node a
  start_node b
  wait_socket a
  wait_socket b
  cat >"$DIR/env" <<ENV
NODE_A=$NODE_A
NODE_B=$NODE_B
SOCK_A=$DIR/a/kv/agent.sock
SOCK_B=$DIR/b/kv/agent.sock
ENV
  echo "two agents up: $NODE_A at $DIR/a/kv/agent.sock, $NODE_B at $DIR/b/kv/agent.sock (logs $DIR/a.log, $DIR/b.log)"
  grep -h '"tcp engine"\|tcp engine' "$DIR/a.log" | tail -n 1 || true
}

down() {
  local name
  for name in a b; do
    stop_one "$name" TERM
  done
  echo "two agents down ($DIR kept for the logs)"
}

status() {
  local name
  for name in a b; do
    if alive "$DIR/$name.pid"; then echo "$name: running, pid $(cat "$DIR/$name.pid")"; else echo "$name: not running"; fi
  done
}

case ${1:-} in
up) up ;;
down) down ;;
status) status ;;
restart) restart "${2:-}" "${3:-}" ;;
*) echo "usage: hack/two-agents.sh up|down|status|restart a|b [TERM|KILL] (AGENT=/path/to/agent)" >&2; exit 2 ;;
esac
