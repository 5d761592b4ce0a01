// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package h2stall

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Calls starts n calls of method (a gRPC full method name) on conn, each announcing a 4 MiB request and sending
// 1 KiB of it, then stalling. It returns, by stream id, how the server ended each call it ended within wait: its
// grpc-status, HTTP status and grpc-message, or "reset <code>".
func Calls(conn net.Conn, method string, n int, wait time.Duration) (map[uint32]string, error) {
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		return nil, fmt.Errorf("writing the preface: %w", err)
	}
	fr := http2.NewFramer(conn, conn)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if err := fr.WriteSettings(); err != nil {
		return nil, fmt.Errorf("writing settings: %w", err)
	}
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", method},
		{":authority", "localhost"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	body := binary.BigEndian.AppendUint32([]byte{0}, 4<<20)
	body = append(body, make([]byte, 1024)...)
	for i := range n {
		id := uint32(2*i + 1)
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true}); err != nil {
			return nil, fmt.Errorf("writing call %d's headers: %w", i, err)
		}
		if err := fr.WriteData(id, false, body); err != nil {
			return nil, fmt.Errorf("writing call %d's data: %w", i, err)
		}
	}
	ended := map[uint32]string{}
	_ = conn.SetReadDeadline(time.Now().Add(wait))
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return ended, nil // wait passed, or the server hung up
		}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			for _, h := range f.Fields {
				if h.Name == "grpc-status" {
					ended[f.StreamID] = h.Value + " " + f.PseudoValue("status")
				}
				if h.Name == "grpc-message" {
					ended[f.StreamID] += " " + h.Value
				}
			}
		case *http2.RSTStreamFrame:
			if ended[f.StreamID] == "" { // an answered call is also reset, since its request never ended
				ended[f.StreamID] = "reset " + f.ErrCode.String()
			}
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = fr.WriteSettingsAck()
			}
		}
	}
}
