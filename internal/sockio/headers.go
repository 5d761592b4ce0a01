// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package sockio

// MaxHeaderListBytes bounds one gRPC call's header block on the agent's servers (its socket, the peer channel):
// the headers of a call arrive, and are held, before the call and every limit of the agent's exist, and gRPC's own
// bound is 16 MiB a block. The agent's calls carry a few short names (the session, a deadline); 64 KiB leaves
// room for a caller's tracing headers.
const MaxHeaderListBytes = 64 << 10
