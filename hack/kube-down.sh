#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# hack/kube-down.sh STATE_DIR stops what hack/kube-up.sh started, by recorded PID, and removes the state unless
# KEEP_STATE=1.
set -uo pipefail
ST=${1:?usage: hack/kube-down.sh STATE_DIR}
for name in controller-manager apiserver etcd; do
  f=$ST/$name.pid
  [ -f "$f" ] || continue
  pid=$(cat "$f")
  kill "$pid" 2>/dev/null
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
  kill -9 "$pid" 2>/dev/null
  rm -f "$f"
done
[ "${KEEP_STATE:-0}" = 1 ] || rm -rf "$ST"
