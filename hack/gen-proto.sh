#!/usr/bin/env bash
# hack/gen-proto.sh generates the Go and Python code of the agent protos (api/proto/**.proto), the only way
# that code is made. The output is checked in; `hack/gen-proto.sh --verify` regenerates into a scratch
# folder and fails when the checked-in files differ (stale, or edited by hand).
#
# Needs: protoc with the well-known types (Debian: apt-get install protobuf-compiler libprotobuf-dev),
# bin/protoc-gen-go and bin/protoc-gen-go-grpc (hack/tools.sh protoc-gen), and for the Python gRPC stub
# Debian's python3-grpc-tools (only its grpc_python plugin is used; messages come from protoc itself).
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

command -v protoc >/dev/null || die "protoc not found: apt-get install protobuf-compiler libprotobuf-dev"
[ -x "$BIN/protoc-gen-go" ] || die "$BIN/protoc-gen-go missing: run hack/tools.sh protoc-gen"
[ -x "$BIN/protoc-gen-go-grpc" ] || die "$BIN/protoc-gen-go-grpc missing: run hack/tools.sh protoc-gen"
"$PYTHON" -c 'import grpc_tools.protoc' 2>/dev/null || die "python grpc_tools missing: apt-get install python3-grpc-tools"

# generate OUT_DIR writes every generated file under OUT_DIR, laid out as in the repository.
generate() {
  local out=$1
  mkdir -p "$out/$PY_OUT"
  (cd "$ROOT/$PROTO_ROOT" &&
    protoc -I . \
      --plugin=protoc-gen-go="$BIN/protoc-gen-go" --plugin=protoc-gen-go-grpc="$BIN/protoc-gen-go-grpc" \
      --go_out="$out" --go_opt=module=$MODULE \
      --go-grpc_out="$out" --go-grpc_opt=module=$MODULE \
      "${GO_PROTOS[@]}" &&
    protoc -I . --python_out="$out/$PY_OUT" "${PY_PROTOS[@]}")
  # Debian's grpc_tools bundles an older protoc; only its gRPC plugin output is taken. Its include path
  # provides the well-known types.
  local wkt
  wkt=$("$PYTHON" -c 'import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), "_proto"))')
  (cd "$ROOT/$PROTO_ROOT" && "$PYTHON" -m grpc_tools.protoc -I . -I "$wkt" \
    --grpc_python_out="$out/$PY_OUT" "${PY_PROTOS[@]}")
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
  [ $status -eq 0 ] && echo "gen-proto: generated code is up to date"
  exit $status
fi

generate "$ROOT"
echo "gen-proto: generated Go in $PROTO_ROOT and Python in $PY_OUT"
