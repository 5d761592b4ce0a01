// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package fdsocket is the agent's fd socket, agent.fd.sock beside the agent socket, and the token store behind
// it. gRPC carries no file descriptors, so a caller sends them here first ("PUT" or "PUT <n>", SCM_RIGHTS) and
// gets a one-time token that a later gRPC call (RegisterMemory, an id arena) names; descriptors the agent lends
// (pool memory) go the other way with "GET <token>".
//
// A connection is identified before anything is read from it, so a refused process never makes the agent hold
// its descriptors; connections, tokens and waiting descriptors are bounded in all and per caller, and a caller at
// a bound is answered RESOURCE_EXHAUSTED without touching what others hold.
package fdsocket
