#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# hack/tools.sh builds the pinned tools the tests, the demo and code generation need, from the Go module
# proxy only: kube-apiserver, kubectl, kube-controller-manager and kube-scheduler (k8s.io/kubernetes with its
# staging modules pinned), etcd, helm, controller-gen, the protobuf/gRPC code generators and staticcheck.
#
# Idempotent: a tool whose versioned binary already exists is not rebuilt. Builds land in
# $TOOLS_CACHE/versioned/<tool>-<version>/ (default ~/.cache/fabricxfer/tools, outside the clone, so a fresh
# clone on a reused machine pays nothing); $BIN_DIR (default ./bin) only holds symlinks.
#
# Usage: hack/tools.sh [k8s|etcd|helm|controller-gen|protoc-gen|staticcheck ...]   (default: all of them)
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.37.2}
ETCD_VERSION=${ETCD_VERSION:-v3.7.3}
HELM_VERSION=${HELM_VERSION:-v3.22.0}
CONTROLLER_TOOLS_VERSION=${CONTROLLER_TOOLS_VERSION:-v0.23.0}
PROTOC_GEN_GO_VERSION=${PROTOC_GEN_GO_VERSION:-v1.36.12}
PROTOC_GEN_GO_GRPC_VERSION=${PROTOC_GEN_GO_GRPC_VERSION:-v1.6.2}
STATICCHECK_VERSION=${STATICCHECK_VERSION:-v0.8.2}

TOOLS_CACHE=${TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fabricxfer/tools}
BIN=${BIN_DIR:-$PWD/bin}
VER=$TOOLS_CACHE/versioned
SRC=$TOOLS_CACHE/src
mkdir -p "$BIN" "$VER" "$SRC"
export GOWORK=off GOFLAGS="${GOFLAGS:-} -trimpath"

log() { printf '[tools %s] %s\n' "$(date +%T)" "$*" >&2; }
link() { ln -sfn "$2" "$BIN/$1"; }

# k8s.io/kubernetes requires its staging modules at v0.0.0 with replaces into ./staging; a throwaway module
# re-points every such replace at the published v0.<minor>.<patch> tag so `go build` can resolve them.
write_k8s_gomod() {
  local dir=$1 staging=$2 gomod
  gomod=$(cd "$dir" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
  {
    printf 'module local/kubernetes-tools\n\ngo 1.26.0\n\nreplace (\n'
    sed -n '/^replace (/,/^)/p' "$gomod" | awk '/=>/{print $1}' | while read -r m; do
      if grep -Eq "^[[:space:]]$m v0\.0\.0([[:space:]]|$)" "$gomod"; then printf '\t%s => %s %s\n' "$m" "$m" "$staging"; fi
    done
    printf ')\n'
  } >"$dir/go.mod.tmp"
  mv "$dir/go.mod.tmp" "$dir/go.mod"
}

build_k8s() {
  local out=$VER/kubernetes-$K8S_VERSION need=() c
  for c in "$@"; do [ -x "$out/$c" ] || need+=("$c"); done
  if [ ${#need[@]} -gt 0 ]; then
    local dir=$SRC/kubernetes-$K8S_VERSION staging=v0.${K8S_VERSION#v1.} minor=${K8S_VERSION#v1.}
    minor=${minor%%.*}
    mkdir -p "$dir" "$out/.tmp"
    if [ ! -f "$dir/go.mod" ]; then
      log "resolving k8s.io/kubernetes@$K8S_VERSION (staging modules at $staging)"
      write_k8s_gomod "$dir" "$staging"
    fi
    (cd "$dir" && for c in "${need[@]}"; do go get -tool "k8s.io/kubernetes/cmd/$c@$K8S_VERSION"; done)
    local v=k8s.io/component-base/version
    log "building ${need[*]} $K8S_VERSION (about 6 minutes cold on 2 cores)"
    (cd "$dir" && go build -ldflags "-s -w -X $v.gitVersion=$K8S_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION" \
      -o "$out/.tmp/" $(printf 'k8s.io/kubernetes/cmd/%s ' "${need[@]}"))
    for c in "${need[@]}"; do mv "$out/.tmp/$c" "$out/$c"; done
    rmdir "$out/.tmp"
  fi
  for c in "$@"; do link "$c" "$out/$c"; done
}

build_etcd() {
  local out=$VER/etcd-$ETCD_VERSION dir=$SRC/etcd-$ETCD_VERSION
  if [ ! -x "$out/etcd" ]; then
    mkdir -p "$dir" "$out"
    [ -f "$dir/go.mod" ] || printf 'module local/etcd-tools\n\ngo 1.26.0\n' >"$dir/go.mod"
    log "building etcd $ETCD_VERSION"
    (cd "$dir" && go get -tool "go.etcd.io/etcd/server/v3@$ETCD_VERSION" && go build -ldflags "-s -w" -o "$out/etcd.tmp" go.etcd.io/etcd/server/v3)
    mv "$out/etcd.tmp" "$out/etcd"
  fi
  link etcd "$out/etcd"
}

go_install() { # go_install NAME PACKAGE VERSION [extra ldflags]
  local out=$VER/$1-$3
  if [ ! -x "$out/$1" ]; then
    log "go install $2@$3"
    GOBIN=$out CGO_ENABLED=0 go install -ldflags "-s -w ${4:-}" "$2@$3"
  fi
  link "$1" "$out/$1"
}

build_helm() {
  # Without these -X flags helm reports KubeVersion v1.20.0 to charts and to `helm lint`.
  local p=helm.sh/helm/v3 minor=${K8S_VERSION#v1.}
  minor=${minor%%.*}
  go_install helm "$p/cmd/helm" "$HELM_VERSION" \
    "-X $p/internal/version.version=$HELM_VERSION -X $p/pkg/chartutil.k8sVersionMajor=1 -X $p/pkg/chartutil.k8sVersionMinor=$minor -X $p/pkg/lint/rules.k8sVersionMajor=1 -X $p/pkg/lint/rules.k8sVersionMinor=$minor"
}

[ $# -gt 0 ] || set -- controller-gen protoc-gen staticcheck etcd helm k8s
for tool in "$@"; do
  case $tool in
  k8s) build_k8s kube-apiserver kubectl kube-controller-manager kube-scheduler ;;
  etcd) build_etcd ;;
  helm) build_helm ;;
  controller-gen) go_install controller-gen sigs.k8s.io/controller-tools/cmd/controller-gen "$CONTROLLER_TOOLS_VERSION" ;;
  protoc-gen)
    go_install protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go "$PROTOC_GEN_GO_VERSION"
    go_install protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc "$PROTOC_GEN_GO_GRPC_VERSION"
    ;;
  staticcheck) go_install staticcheck honnef.co/go/tools/cmd/staticcheck "$STATICCHECK_VERSION" ;;
  *)
    echo "hack/tools.sh: unknown tool $tool (want k8s, etcd, helm, controller-gen, protoc-gen or staticcheck)" >&2
    exit 2
    ;;
  esac
done
log "ready in $BIN: $(ls "$BIN" | tr '\n' ' ')"
