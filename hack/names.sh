#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# hack/names.sh, sourced by the test scripts: the names the operator gives what it owns for a pool, as
# controllers.AgentObjectName makes them (controllers' TestOwnedNamesMatchTheScripts keeps the two equal).
# The agents' namespace is where the operator runs agents when it is told nothing else.
AGENT_NS=${AGENT_NS:-fabricxfer-system}

# agent_object_name NS POOL: readable namespace-pool cut to 29 characters, and 16 hex digits of
# sha256("NS/POOL").
agent_object_name() {
  local readable hash
  readable=$(printf '%s' "$1-$2" | sed 's/^-*//; s/-*$//' | cut -c1-29 | sed 's/-*$//')
  hash=$(printf '%s' "$1/$2" | sha256sum | cut -c1-16)
  echo "fabricxfer-agent-$readable-$hash"
}
