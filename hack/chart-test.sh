#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# hack/chart-test.sh checks the Helm chart offline, in a few seconds:
#   - helm lint --strict, with the default values and with every feature on;
#   - helm template output equals charts/fabricxfer/testdata/<case>.golden.yaml (UPDATE=1 rewrites them);
#   - values.schema.json refuses a wrong type and an unknown key;
#   - the generated CRD templates and operator rules match config/ (hack/gen-chart.sh).
# Needs bin/helm (make tools). Exits non-zero on the first class of failure it finds, after running every check.
set -euo pipefail
cd "$(dirname "$0")/.."

HELM=${HELM:-$PWD/bin/helm}
chart=charts/fabricxfer
testdata=$chart/testdata
# Pinned so the output does not depend on the Kubernetes version compiled into the helm binary.
kube_version=1.37.0
release=fabricxfer
namespace=fabricxfer-system

[ -x "$HELM" ] || { echo "chart-test: $HELM not found; run make tools" >&2; exit 2; }

failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
pass() { echo "ok:   $*"; }

# case name -> extra helm arguments
declare -A cases=(
  [default]=""
  [all-features]="-f $testdata/all-features.values.yaml"
)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The generated parts (CRDs, operator rules) must be what hack/gen-chart.sh makes from config/ today.
CHART_DIR=$work/generated hack/gen-chart.sh
if diff -r "$work/generated/templates/crds" $chart/templates/crds >"$work/gen.diff" &&
  diff "$work/generated/templates/_rules.tpl" $chart/templates/_rules.tpl >>"$work/gen.diff" &&
  diff "$work/generated/templates/agent-policy.yaml" $chart/templates/agent-policy.yaml >>"$work/gen.diff" &&
  diff "$work/generated/templates/agent-priority.yaml" $chart/templates/agent-priority.yaml >>"$work/gen.diff"; then
  pass "generated CRD templates and operator rules match config/"
else
  head -40 "$work/gen.diff" >&2
  fail "chart templates are stale against config/; run hack/gen-chart.sh (make manifests)"
fi

# The chart ships the dashboard of docs/grafana (Helm reads files only inside the chart, so it keeps a copy).
if cmp -s docs/grafana/fabricxfer-engines.json $chart/dashboards/fabricxfer-engines.json; then
  pass "the chart's dashboard is docs/grafana/fabricxfer-engines.json"
else
  fail "charts/fabricxfer/dashboards/fabricxfer-engines.json differs from docs/grafana; copy it over"
fi

for name in default all-features; do
  # shellcheck disable=SC2086 # the extra arguments are meant to split
  if "$HELM" lint --strict --kube-version "$kube_version" $chart ${cases[$name]} >"$work/lint-$name.log" 2>&1; then
    pass "helm lint --strict ($name)"
  else
    cat "$work/lint-$name.log" >&2
    fail "helm lint --strict ($name)"
  fi

  golden=$testdata/$name.golden.yaml
  # shellcheck disable=SC2086
  if ! "$HELM" template "$release" $chart --namespace "$namespace" --kube-version "$kube_version" \
    ${cases[$name]} >"$work/$name.yaml" 2>"$work/$name.err"; then
    cat "$work/$name.err" >&2
    fail "helm template ($name)"
    continue
  fi
  if [ "${UPDATE:-0}" = 1 ]; then
    cp "$work/$name.yaml" "$golden"
    pass "rewrote $golden"
  elif [ ! -f "$golden" ]; then
    fail "$golden is missing; run UPDATE=1 $0"
  elif diff -u "$golden" "$work/$name.yaml" >"$work/$name.diff"; then
    pass "helm template matches $golden"
  else
    head -100 "$work/$name.diff" >&2
    fail "helm template ($name) differs from $golden; if the change is intended run UPDATE=1 $0"
  fi
done

# The schema must refuse bad values: each case names the values and a phrase the error must contain.
expect_refused() {
  local what=$1 phrase=$2
  shift 2
  if "$HELM" template "$release" $chart --kube-version "$kube_version" "$@" >/dev/null 2>"$work/refused.err"; then
    fail "schema accepted $what"
  elif grep -qF -- "$phrase" "$work/refused.err"; then
    pass "schema refuses $what"
  else
    cat "$work/refused.err" >&2
    fail "refusing $what did not say \"$phrase\""
  fi
}
expect_refused "a string for replicaCount" "at '/replicaCount': got string, want integer" --set replicaCount=two
expect_refused "an unknown top-level key" "additional properties 'replicas' not allowed" --set replicas=2
expect_refused "an unknown nested key" "additional properties 'enable' not allowed" --set networkPolicy.enable=true
expect_refused "an engine outside the enum" "/defaultPool/spec/engines/0" --set 'defaultPool.spec.engines={nvlink}'
expect_refused "root's group as the socket group" "/defaultPool/spec/socketGroup" --set defaultPool.spec.socketGroup=0
expect_refused "a socket group past 2^31-1" "/defaultPool/spec/socketGroup" --set defaultPool.spec.socketGroup=2147483648

expect_refused "an unknown key under agent.apiPriority" "additional properties 'enable' not allowed" --set agent.apiPriority.enable=true
expect_refused "a string for agent.apiPriority.enabled" "at '/agent/apiPriority/enabled': got string, want boolean" --set-string agent.apiPriority.enabled=yes
expect_refused "a relative MPS pipe folder" "/agent/mps/pipeDirectory" --set agent.mps.pipeDirectory=run/nvidia/mps
expect_refused "an unknown key under agent.mps" "additional properties 'pipeDir' not allowed" --set agent.mps.pipeDir=/run/nvidia/mps
expect_refused "a ServiceMonitor without the metrics Service" "metrics.serviceMonitor.enabled needs metrics.service.enabled" \
  --set metrics.serviceMonitor.enabled=true --set metrics.service.enabled=false

# count_in_render prints how many lines of the rendered chart match a pattern.
count_in_render() {
  local pattern=$1
  shift
  "$HELM" template "$release" $chart --kube-version "$kube_version" "$@" | grep -c -- "$pattern" || true
}
n=$(count_in_render '^kind: CustomResourceDefinition$')
[ "$n" = "$(ls config/crd/bases/*.yaml | wc -l)" ] && pass "every CRD of config/ is rendered ($n)" || fail "rendered $n CRDs"
n=$(count_in_render 'helm.sh/resource-policy: keep')
[ "$n" = "$(ls config/crd/bases/*.yaml | wc -l)" ] && pass "every CRD is kept on uninstall" || fail "$n CRDs carry resource-policy keep"
n=$(count_in_render '^kind: CustomResourceDefinition$' --set crds.enabled=false)
[ "$n" = 0 ] && pass "crds.enabled=false renders no CRD" || fail "crds.enabled=false still renders $n CRDs"
n=$(count_in_render 'helm.sh/resource-policy: keep' --set crds.keep=false)
[ "$n" = 0 ] && pass "crds.keep=false lets uninstall remove the CRDs" || fail "crds.keep=false still keeps $n CRDs"

# The agents' API Priority and Fairness (config/flowcontrol/agent_priority.yaml): two FlowSchemas and their
# PriorityLevelConfiguration for the agents' namespace, and one for the operator's ServiceAccount, on by default,
# gone with agent.apiPriority.enabled=false.
declare -A apf_kinds=([FlowSchema]=3 [PriorityLevelConfiguration]=1)
for kind in "${!apf_kinds[@]}"; do
  n=$(count_in_render "^kind: $kind\$")
  [ "$n" = "${apf_kinds[$kind]}" ] && pass "the API Priority and Fairness $kind rendered by default ($n)" || fail "rendered $n API Priority and Fairness $kind by default, not ${apf_kinds[$kind]}"
  n=$(count_in_render "^kind: $kind\$" --set agent.apiPriority.enabled=false)
  [ "$n" = 0 ] && pass "agent.apiPriority.enabled=false renders no $kind" || fail "agent.apiPriority.enabled=false still renders $n $kind"
done
# subjects prints each ServiceAccount subject of the rendered FlowSchemas as name/namespace, one a line.
subjects() {
  "$HELM" template "$release" $chart --namespace "$namespace" --kube-version "$kube_version" "$@" |
    awk '/^---/ { fs = 0; sa = 0 } /^kind: FlowSchema$/ { fs = 1 } fs && /^    - kind: ServiceAccount$/ { sa = 1; next }
      fs && sa && /^      serviceAccount: \{name: .*, namespace: .*\}$/ { gsub(/[{},]/, ""); print $3 "/" $5; sa = 0 }
      fs && sa && /^        name:/ { name = $2 } fs && sa && /^        namespace:/ { print name "/" $2; sa = 0 }'
}
got=$(subjects | sort | uniq -c | awk '{ print $1, $2 }' | paste -sd' ')
[ "$got" = '2 "*"/fabricxfer-system 1 fabricxfer-operator/fabricxfer-system' ] &&
  pass "both agents' FlowSchemas match every ServiceAccount of the release namespace, the operator's its ServiceAccount" ||
  fail "the FlowSchemas match [$got], not every ServiceAccount of $namespace twice and the operator's once"
got=$(subjects --set agent.namespace=gpu-agents --set serviceAccount.name=xfer-op | sort | uniq -c | awk '{ print $1, $2 }' | paste -sd' ')
[ "$got" = '2 "*"/gpu-agents 1 xfer-op/fabricxfer-system' ] &&
  pass "the agents' FlowSchemas follow agent.namespace, the operator's its ServiceAccount in the release namespace" ||
  fail "with agent.namespace=gpu-agents and serviceAccount.name=xfer-op the FlowSchemas match [$got]"

if [ "$failures" -ne 0 ]; then
  echo "chart-test: $failures check(s) failed" >&2
  exit 1
fi
echo "chart-test: all checks passed"
