// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package fdsockettest holds what tests of the fd socket share, in fdsocket's own tests and in the agent
// server's hostile-client suite: a flood of descriptors at an fd socket and a count of this process's open
// descriptors.
package fdsockettest
