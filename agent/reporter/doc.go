// Package reporter keeps a node's TransferNode current: it writes the object (spec, labels and an owner
// reference to the Node, so the report goes with its Node) with server-side apply, then, every period,
// re-detects the node and applies the status with a fresh heartbeat, so a change such as a NIC going down
// shows within one period.
package reporter
