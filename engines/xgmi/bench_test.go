// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package xgmi_test

import (
	"context"
	"testing"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/xgmi"
)

// BenchmarkSubmitWait is the engine's own cost around one copy that goes through its worker goroutines (a host
// copy above the inline limit): plan, submit, wait. BenchmarkPlainCopy is the same bytes with copy().
func BenchmarkSubmitWait(b *testing.B) {
	const size = 128 << 10
	e, err := xgmi.New(xgmi.Options{Node: "node-a"}, xgmi.NewHostBackend())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.Close() })
	ctx := context.Background()
	reg := func(id string) engines.MemoryDesc {
		d, err := e.Register(ctx, engines.MemoryDesc{ID: engines.MemoryID(id), Node: "node-a",
			Location: engines.Location{Kind: engines.LocationHost}, Size: size, Handles: engines.Handles{Host: make([]byte, size)}})
		if err != nil {
			b.Fatal(err)
		}
		return d
	}
	src, dst := reg("node-a/src"), reg("node-a/dst")
	b.SetBytes(size)
	for b.Loop() {
		p := e.NewPlan()
		if err := p.Add(engines.Item{Src: src.ID, Dst: dst.ID, Size: size, Tag: 1}); err != nil {
			b.Fatal(err)
		}
		tr, err := e.Submit(ctx, p.Build(), engines.SubmitOptions{})
		if err != nil {
			b.Fatal(err)
		}
		if err := tr.Wait(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPlainCopy(b *testing.B) {
	const size = 128 << 10
	src, dst := make([]byte, size), make([]byte, size)
	b.SetBytes(size)
	for b.Loop() {
		copy(dst, src)
	}
}
