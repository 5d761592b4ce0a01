// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package h2stall speaks raw HTTP/2 to a gRPC server as a hostile client would, for tests: calls whose requests
// announce 4 MiB, send a little of it and stall, which gRPC buffers before any handler or check runs.
package h2stall
