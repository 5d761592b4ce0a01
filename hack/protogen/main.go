// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Command protogen generates the Go code of the agent protos without protoc, and checks the checked-in Python
// modules' descriptors against the .proto files (hack/gen-proto.sh runs it).
//
//	protogen -proto-root api/proto -out . -go-opt module=M -plugin-go bin/protoc-gen-go \
//	    -plugin-go-grpc bin/protoc-gen-go-grpc -check-python fabricxfer/agent/v1/agent.proto=client/python/... a.proto b.proto
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/fabricxfer/fabricxfer/hack/internal/protogen"
)

func main() {
	var opts protogen.Options
	flag.StringVar(&opts.ProtoRoot, "proto-root", "api/proto", "import root of the .proto files")
	flag.StringVar(&opts.OutDir, "out", ".", "folder the generated files are written under")
	flag.StringVar(&opts.GoOpt, "go-opt", "", "parameter for both Go plugins (e.g. module=github.com/x/y)")
	flag.StringVar(&opts.PluginGo, "plugin-go", "bin/protoc-gen-go", "protoc-gen-go executable")
	flag.StringVar(&opts.PluginGoGRPC, "plugin-go-grpc", "bin/protoc-gen-go-grpc", "protoc-gen-go-grpc executable")
	var checks string
	flag.StringVar(&checks, "check-python", "", "comma-separated proto=_pb2.py pairs whose embedded descriptor must match")
	flag.Parse()
	opts.Files = flag.Args()
	for _, pair := range strings.Split(checks, ",") {
		if pair == "" {
			continue
		}
		proto, py, ok := strings.Cut(pair, "=")
		if !ok {
			fmt.Fprintf(os.Stderr, "protogen: -check-python wants proto=file.py, got %q\n", pair)
			os.Exit(2)
		}
		opts.PythonChecks = append(opts.PythonChecks, protogen.PythonCheck{Proto: proto, Module: py})
	}
	if err := protogen.Run(context.Background(), opts); err != nil {
		fmt.Fprintf(os.Stderr, "protogen: %v\n", err)
		os.Exit(1)
	}
}
