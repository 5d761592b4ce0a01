// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server

// FDFloodPeak lets the hostile-client suite (package server_test) run the fd flood of the package's own tests.
var FDFloodPeak = fdFloodPeak
