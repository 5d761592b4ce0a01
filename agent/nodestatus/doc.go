// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package nodestatus turns what topology detected on a node into the TransferNode status the node's agent
// writes, applying the API's size limits so a report is always accepted. It is pure (no API calls): package
// nodesync writes what it builds.
package nodestatus
