// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package tcp

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
)

// BenchmarkWireModes writes 64 MiB of host memory to another node over loopback: plain Go TCP streams between
// goroutines (the ceiling of the same run, as many streams as the engine's connections), the engine over plain TCP, over mutual TLS with TLS's own
// records (agents that predate sealed records), and over mutual TLS with sealed records (agents today).
func BenchmarkWireModes(b *testing.B) {
	const size = 64 << 20
	b.Run("raw-tcp", func(b *testing.B) {
		// The ceiling: as many plain TCP streams as the engine's connections, each received into a 4 MiB buffer.
		const streams = 4
		ln := listen(b)
		defer ln.Close()
		done := make(chan error, streams)
		for range streams {
			go func() {
				c, err := ln.Accept()
				if err == nil {
					buf := make([]byte, 4<<20)
					for err == nil {
						_, err = c.Read(buf)
					}
					c.Close()
				}
				if errors.Is(err, io.EOF) {
					err = nil
				}
				done <- err
			}()
		}
		conns := make([]net.Conn, streams)
		for i := range conns {
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			conns[i] = c
		}
		buf := pattern(size/streams, 1)
		b.SetBytes(size)
		for b.Loop() {
			var wg sync.WaitGroup
			for _, c := range conns {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if _, err := c.Write(buf); err != nil {
						b.Error(err)
					}
				}()
			}
			wg.Wait()
		}
		for _, c := range conns {
			c.Close()
		}
		for range streams {
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		}
	})
	ca := newCA(b)
	for _, mode := range []struct {
		name       string
		tls        bool
		tlsRecords bool
	}{{"engine-plain-tcp", false, false}, {"engine-tls-records", true, true}, {"engine-sealed-records", true, false}} {
		b.Run(mode.name, func(b *testing.B) {
			opts := func(node string, ln net.Listener) Options {
				o := Options{Node: node, Listener: ln, PeerTimeout: 10 * time.Second, Logf: b.Logf, tlsRecordsOnly: mode.tlsRecords}
				if mode.tls {
					o.TLS = ca.config(b, node)
				}
				return o
			}
			peer, err := New(opts("node-b", listen(b)))
			if err != nil {
				b.Fatal(err)
			}
			defer peer.Close()
			a, err := New(opts("node-a", nil))
			if err != nil {
				b.Fatal(err)
			}
			defer a.Close()
			src := register(b, a, "node-a/src", pattern(size, 2))
			dst := register(b, peer, "node-b/dst", make([]byte, size))
			imp(b, a, dst)
			b.SetBytes(size)
			for b.Loop() {
				if err := moveWithin(a, 30*time.Second, item(engines.Item{Src: src.ID, Dst: dst.ID, Size: size})); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSealedChunk is the latency of one staged chunk on one connection: a 737,280-byte Write (an 11 MB
// transfer cut for four connections: three records) sealed, written over loopback, read and opened whole.
// first-write-µs is how long the Write took to start its first system call.
func BenchmarkSealedChunk(b *testing.B) {
	const size = 737280
	client, server, _ := sealedPair(b)
	log := &writeLog{Conn: client.Conn}
	client.Conn = log
	msg, got := pattern(size, 5), make([]byte, size)
	wrote := make(chan error, 1)
	var toFirst time.Duration
	b.SetBytes(size)
	for b.Loop() {
		log.reset()
		start := time.Now()
		go func() { _, err := client.Write(msg); wrote <- err }()
		if _, err := io.ReadFull(server, got); err != nil {
			b.Fatal(err)
		}
		if err := <-wrote; err != nil {
			b.Fatal(err)
		}
		toFirst += log.reset().Sub(start)
	}
	b.ReportMetric(float64(toFirst.Microseconds())/float64(b.N), "first-write-µs")
}
