// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/tcp"
)

const (
	benchNode = "bench-a"
	peerNode  = "bench-b"

	plainWrite byte = 1
	plainRead  byte = 2
)

func init() {
	registerMode(Mode{Name: "tcp", Description: "host memory to or from a peer process over the tcp engine; baseline plain Go TCP between the same processes",
		Setup: func(ctx context.Context, cfg SetupConfig) (*Target, error) {
			return setupRemote(ctx, cfg, nil, func(t engines.Engine) (engines.Engine, error) { return t, nil })
		}})
}

// peerHello is what the peer process prints once ready.
type peerHello struct {
	Desc  string `json:"desc"`  // base64 of the wire-encoded region descriptor
	Plain string `json:"plain"` // address of the plain TCP baseline server
}

// setupRemote starts a peer process holding one region, and a local tcp engine (wrapped by wrap, e.g. into a
// composite) holding the other. For "write" the local region is the source; for "read" the destination.
// regions, when set, is the node's region table the tcp engine shares with the composite wrap builds.
func setupRemote(ctx context.Context, cfg SetupConfig, regions *engines.Registry, wrap func(engines.Engine) (engines.Engine, error)) (*Target, error) {
	cmd := exec.Command(cfg.Self, "peer", "-capacity", fmt.Sprint(cfg.Capacity))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the peer process: %w", err)
	}
	stopPeer := func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	}
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- s
		io.Copy(io.Discard, stdout)
	}()
	var hello peerHello
	select {
	case s := <-line:
		if err := json.Unmarshal([]byte(s), &hello); err != nil {
			stopPeer()
			return nil, fmt.Errorf("peer process said %q: %w", strings.TrimSpace(s), err)
		}
	case <-time.After(30 * time.Second):
		stopPeer()
		return nil, errors.New("peer process not ready within 30 s")
	}
	raw, err := base64.StdEncoding.DecodeString(hello.Desc)
	if err != nil {
		stopPeer()
		return nil, err
	}
	remote, err := engines.UnmarshalDesc(raw)
	if err != nil {
		stopPeer()
		return nil, err
	}

	te, err := tcp.New(tcp.Options{Node: benchNode, ConnsPerPeer: cfg.Conns, ChunkBytes: cfg.ChunkBytes, Registry: regions})
	if err != nil {
		stopPeer()
		return nil, err
	}
	e, err := wrap(te)
	if err != nil {
		te.Close()
		stopPeer()
		return nil, err
	}
	local, freeLocal, err := hostMemory(cfg.Capacity)
	if err != nil {
		e.Close()
		stopPeer()
		return nil, err
	}
	closeAll := func() error {
		err := e.Close()
		stopPeer()
		freeLocal()
		return err
	}
	ld, err := e.Register(ctx, hostDesc(benchNode+"/bench", benchNode, local))
	if err == nil {
		err = e.Import(ctx, remote)
	}
	if err != nil {
		closeAll()
		return nil, err
	}
	t := &Target{Engine: e, Src: ld.ID, Dst: remote.ID, BaselineName: "plain-tcp", Close: closeAll}
	op := plainWrite
	if cfg.Op == "read" {
		t.Src, t.Dst, op = remote.ID, ld.ID, plainRead
	}
	conns := &plainConns{addr: hello.Plain}
	t.Baseline = func(ctx context.Context, thread int, off, n uint64) error {
		return conns.move(ctx, thread, op, local[off:off+n], off)
	}
	prev := t.Close
	t.Close = func() error { conns.close(); return prev() }
	return t, nil
}

// plainConns is the baseline: one plain TCP connection per thread to the peer's plain server, moving the same
// bytes between the same memory as the engine.
type plainConns struct {
	addr string
	mu   sync.Mutex
	byID map[int]net.Conn
}

func (p *plainConns) conn(ctx context.Context, thread int) (net.Conn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.byID[thread]; ok {
		return c, nil
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", p.addr)
	if err != nil {
		return nil, err
	}
	if p.byID == nil {
		p.byID = map[int]net.Conn{}
	}
	p.byID[thread] = c
	return c, nil
}

func (p *plainConns) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.byID {
		c.Close()
	}
}

func (p *plainConns) move(ctx context.Context, thread int, op byte, local []byte, off uint64) error {
	c, err := p.conn(ctx, thread)
	if err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok {
		c.SetDeadline(d)
	}
	hdr := make([]byte, 17)
	hdr[0] = op
	binary.BigEndian.PutUint64(hdr[1:], uint64(len(local)))
	binary.BigEndian.PutUint64(hdr[9:], off)
	if op == plainWrite {
		bufs := net.Buffers{hdr, local}
		if _, err := bufs.WriteTo(c); err != nil {
			return err
		}
		var ack [1]byte
		_, err = io.ReadFull(c, ack[:])
		return err
	}
	if _, err := c.Write(hdr); err != nil {
		return err
	}
	_, err = io.ReadFull(c, local)
	return err
}

// runPeer is the peer process: a tcp engine serving one region, and the plain TCP server for the baseline,
// until standard input closes.
func runPeer(args []string) error {
	fs := flag.NewFlagSet("peer", flag.ContinueOnError)
	capacity := fs.Uint64("capacity", 64<<20, "region size in bytes")
	listen := fs.String("listen", "127.0.0.1:0", "address of the engine listener")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	plain, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	e, err := tcp.New(tcp.Options{Node: peerNode, Listener: ln, Logf: func(string, ...any) {}})
	if err != nil {
		return err
	}
	defer e.Close()
	mem, free, err := hostMemory(*capacity)
	if err != nil {
		return err
	}
	defer free()
	d, err := e.Register(context.Background(), hostDesc(peerNode+"/bench", peerNode, mem))
	if err != nil {
		return err
	}
	wire, err := engines.MarshalDesc(d)
	if err != nil {
		return err
	}
	go servePlain(plain, mem)
	hello, _ := json.Marshal(peerHello{Desc: base64.StdEncoding.EncodeToString(wire), Plain: plain.Addr().String()})
	fmt.Println(string(hello))
	io.Copy(io.Discard, os.Stdin)
	plain.Close()
	return nil
}

func servePlain(ln net.Listener, mem []byte) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			hdr := make([]byte, 17)
			for {
				if _, err := io.ReadFull(c, hdr); err != nil {
					return
				}
				n, off := binary.BigEndian.Uint64(hdr[1:]), binary.BigEndian.Uint64(hdr[9:])
				if off > uint64(len(mem)) || n > uint64(len(mem))-off {
					return
				}
				switch hdr[0] {
				case plainWrite:
					if _, err := io.ReadFull(c, mem[off:off+n]); err != nil {
						return
					}
					if _, err := c.Write([]byte{1}); err != nil {
						return
					}
				case plainRead:
					if _, err := c.Write(mem[off : off+n]); err != nil {
						return
					}
				default:
					return
				}
			}
		}()
	}
}
