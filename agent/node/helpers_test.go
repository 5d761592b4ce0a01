// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package node

// testdata holds the fixture nodes' host roots.
const testdata = "../../topology/testdata"
