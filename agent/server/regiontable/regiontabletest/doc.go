// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package regiontabletest holds what tests of the region table and its users share: an engine whose
// deregistration drains until a test lets it go.
package regiontabletest
