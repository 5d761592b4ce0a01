// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package sockio holds the socket I/O the agent and its Go client share on the fast socket: length-prefixed
// frames and a reader that polls briefly before sleeping; and the bounds its servers share.
package sockio
