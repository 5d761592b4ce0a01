// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package agentv1 holds the generated Go code of the fabricxfer.agent.v1 protos: the sidecar API inference
// pods call over the agent's Unix socket (agent.proto) and the agent-to-agent API (peer.proto). Regenerate
// with hack/gen-proto.sh; never edit the .pb.go files by hand.
package agentv1
