// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package drakubelet stands in for the kubelet and the container runtime where the demo has neither: for a
// pod the real scheduler bound, it calls NodePrepareResources on the bound node's DRA plugin socket for the
// pod's claims, reads the CDI specs the plugin answered, and runs a command with the container edits applied
// the way a runtime would, with each container path mapped back through the spec's mounts to the host path
// (no mount namespace is needed, so it runs without root).
package drakubelet
