// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package nodecert obtains an agent's own certificate for the agent-to-agent channel: the agent makes a key
// that never leaves it, asks for a certificate naming its node with a Kubernetes CertificateSigningRequest
// (signer fabricxfer.io/agent), which the operator signs with the pool's CA after checking that the request
// came from an agent token bound to that node, and renews it before it expires.
package nodecert
