// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

//go:build !cgo

package nvml

import (
	"errors"

	"github.com/fabricxfer/fabricxfer/topology"
)

// Open reports that this binary cannot load NVML.
func Open() (topology.NVML, func(), error) {
	return nil, nil, errors.New("built without cgo")
}
