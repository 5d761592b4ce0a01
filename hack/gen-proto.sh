#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# hack/gen-proto.sh generates the Go and Python code of the agent protos (api/proto/**.proto), the only way
# that code is made. The output is checked in; `hack/gen-proto.sh --verify` regenerates into a scratch
# folder and fails when the checked-in files differ (stale, or edited by hand).
#
# Go code needs no protoc: hack/protogen compiles the .proto files with protocompile (pure Go, from the module
# proxy) and runs bin/protoc-gen-go and bin/protoc-gen-go-grpc (hack/tools.sh protoc-gen) as protoc would.
# Python modules are written by protoc's own generator, so they are regenerated only where protoc and Debian's
# python3-grpc-tools are installed; elsewhere hack/protogen checks the checked-in modules instead (the
# descriptor embedded in agent_pb2.py must equal the compiled one, agent_pb2_grpc.py must name every method).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN_DIR:-$ROOT/bin}
PYTHON=${PYTHON:-/usr/bin/python3}
MODULE=github.com/fabricxfer/fabricxfer
PROTO_ROOT=api/proto
GO_PROTOS=(fabricxfer/agent/v1/agent.proto fabricxfer/agent/v1/peer.proto)
PY_PROTOS=(fabricxfer/agent/v1/agent.proto)
PY_OUT=client/python

die() { echo "gen-proto: $*" >&2; exit 1; }

[ -x "$BIN/protoc-gen-go" ] || die "$BIN/protoc-gen-go missing: run hack/tools.sh protoc-gen"
[ -x "$BIN/protoc-gen-go-grpc" ] || die "$BIN/protoc-gen-go-grpc missing: run hack/tools.sh protoc-gen"
python_gen=1
if ! command -v protoc >/dev/null || ! "$PYTHON" -c 'import grpc_tools.protoc' 2>/dev/null; then
  python_gen=0
fi

checks=()
for p in "${PY_PROTOS[@]}"; do checks+=("$p=$ROOT/$PY_OUT/${p%.proto}_pb2.py"); done

# generate OUT_DIR writes every generated file under OUT_DIR, laid out as in the repository.
generate() {
  local out=$1 check=
  mkdir -p "$out/$PY_OUT"
  [ $python_gen = 1 ] || check=$(IFS=,; echo "${checks[*]}")
  (cd "$ROOT" && go run ./hack/protogen -proto-root "$PROTO_ROOT" -out "$out" -go-opt "module=$MODULE" \
    -plugin-go "$BIN/protoc-gen-go" -plugin-go-grpc "$BIN/protoc-gen-go-grpc" -check-python "$check" "${GO_PROTOS[@]}")
  [ $python_gen = 1 ] || return 0
  # grpc_tools' include path provides the well-known types (google/protobuf/duration.proto), to protoc too:
  # protoc's own copies come with libprotobuf-dev, which a machine with protoc need not have.
  local wkt
  wkt=$("$PYTHON" -c 'import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), "_proto"))')
  (cd "$ROOT/$PROTO_ROOT" && protoc -I . -I "$wkt" --python_out="$out/$PY_OUT" "${PY_PROTOS[@]}")
  # Debian's grpc_tools bundles an older protoc; only its gRPC plugin output is taken.
  (cd "$ROOT/$PROTO_ROOT" && "$PYTHON" -m grpc_tools.protoc -I . -I "$wkt" \
    --grpc_python_out="$out/$PY_OUT" "${PY_PROTOS[@]}")
}

note() {
  [ $python_gen = 1 ] ||
    echo "gen-proto: protoc or python3-grpc-tools not installed: Python modules checked against the .proto files, not regenerated"
}

if [ "${1:-}" = "--verify" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  generate "$tmp"
  status=0
  while IFS= read -r f; do
    rel=${f#"$tmp"/}
    if ! cmp -s "$f" "$ROOT/$rel"; then
      echo "gen-proto: $rel is out of date (run hack/gen-proto.sh)" >&2
      status=1
    fi
  done < <(find "$tmp" -type f | sort)
  note
  [ $status -eq 0 ] && echo "gen-proto: generated code is up to date"
  exit $status
fi

generate "$ROOT"
note
if [ $python_gen = 1 ]; then echo "gen-proto: generated Go in $PROTO_ROOT and Python in $PY_OUT"; else echo "gen-proto: generated Go in $PROTO_ROOT"; fi
