// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package enginetest

import (
	"context"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/xgmi"
)

// GatedHost is the xgmi host backend behind Gate: its copies wait while the gate is shut, so a test can hold a
// transfer in flight (the host backend itself copies within Submit, where nothing can be held).
type GatedHost struct {
	*xgmi.HostBackend
	Gate *Gate
}

// NewGatedHost is a host backend behind a gate of its own, open.
func NewGatedHost() GatedHost { return GatedHost{HostBackend: xgmi.NewHostBackend(), Gate: &Gate{}} }

// Copy waits for the gate, then copies.
func (g GatedHost) Copy(ctx context.Context, w engines.Work) error {
	if err := g.Gate.Wait(ctx); err != nil {
		return err
	}
	return g.HostBackend.Copy(ctx, w)
}
