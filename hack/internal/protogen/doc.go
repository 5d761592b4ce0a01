// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package protogen generates code from .proto files without protoc: it compiles them with protocompile (a
// pure-Go compiler that produces the descriptors protoc produces) and runs protoc plugins (protoc-gen-go,
// protoc-gen-go-grpc) on them over the plugin protocol. Python messages, which only protoc's own generator
// writes, are checked instead: the descriptor embedded in a checked-in _pb2.py must equal the compiled one.
package protogen
