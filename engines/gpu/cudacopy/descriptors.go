// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cudacopy

import "github.com/fabricxfer/fabricxfer/engines/gpu/internal/scatter"

// Segment is one copy between two addresses the GPU can reach (device
// memory of this or a peer GPU, imported memory, pinned or registered host
// memory), in the unified address space. The descriptor layout the kernels
// read is engines/gpu/internal/scatter's, shared with the HIP backend.
type Segment = scatter.Segment
