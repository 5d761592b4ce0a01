// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package pki makes the certificates the agents of one transfer pool use to authenticate each other (mTLS on
// the agent-to-agent channel). The operator calls these pure functions to fill one Secret per pool with
// tls.crt, tls.key and ca.crt; agents load that directory.
//
// Rotation is safe because trust and identity are separate: ca.crt is a bundle that may hold the old and the
// new CA at once. The operator first adds the new CA to every bundle (AppendToBundle), then re-issues agent
// certificates from it, and finally drops the old CA (PruneBundle) once no certificate signed by it is left.
package pki
