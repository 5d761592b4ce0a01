// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package protogen

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/descriptorpb"
)

const repoRoot = "../../.."

func compileAgent(t *testing.T, root string) *descriptorpb.FileDescriptorProto {
	t.Helper()
	all, err := Compile(context.Background(), root, []string{"fabricxfer/agent/v1/agent.proto"})
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	last := all[len(all)-1]
	if last.GetName() != "fabricxfer/agent/v1/agent.proto" {
		t.Fatalf("last compiled file is %s, want the requested one after its imports", last.GetName())
	}
	if all[0].GetName() != "google/protobuf/duration.proto" {
		t.Fatalf("first file is %s, want the imported google/protobuf/duration.proto", all[0].GetName())
	}
	return last
}

// TestPythonDescriptorMatchesAndCatchesStaleness: the checked-in Python module matches the .proto, and a .proto
// with one more field does not.
func TestPythonDescriptorMatchesAndCatchesStaleness(t *testing.T) {
	py := filepath.Join(repoRoot, "client/python/fabricxfer/agent/v1/agent_pb2.py")
	grpcPy := filepath.Join(repoRoot, "client/python/fabricxfer/agent/v1/agent_pb2_grpc.py")
	fd := compileAgent(t, filepath.Join(repoRoot, "api/proto"))
	if err := CheckPythonDescriptor(py, fd); err != nil {
		t.Fatalf("checked-in module: %v", err)
	}
	if err := CheckPythonGRPC(grpcPy, fd); err != nil {
		t.Fatalf("checked-in gRPC module: %v", err)
	}

	src, err := os.ReadFile(filepath.Join(repoRoot, "api/proto/fabricxfer/agent/v1/agent.proto"))
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	dir := filepath.Join(tmp, "fabricxfer/agent/v1")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	edited := strings.Replace(string(src), "service Agent {", "message AddedByTestMsg { string x = 1; }\n\nservice Agent {\n  rpc AddedByTest(AddedByTestMsg) returns (AddedByTestMsg);", 1)
	if edited == string(src) {
		t.Fatal("the test's edit did not apply: agent.proto has no `service Agent {`")
	}
	if err := os.WriteFile(filepath.Join(dir, "agent.proto"), []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	stale := compileAgent(t, tmp)
	if err := CheckPythonDescriptor(py, stale); err == nil || !strings.Contains(err.Error(), "out of date") {
		t.Fatalf("a message added to the .proto: got %v, want an out-of-date error", err)
	}
	if err := CheckPythonGRPC(grpcPy, stale); err == nil || !strings.Contains(err.Error(), "AddedByTest") {
		t.Fatalf("a method added to the .proto: got %v, want an error naming it", err)
	}
}

// TestJSONNamesAsProtoc: every field gets protoc's json_name, which protoc-gen-go embeds in the raw descriptor.
func TestJSONNamesAsProtoc(t *testing.T) {
	for in, want := range map[string]string{"fd_token": "fdToken", "a_b_c": "aBC", "x": "x", "pool_gpu_bytes2": "poolGpuBytes2"} {
		if got := jsonName(in); got != want {
			t.Errorf("jsonName(%q) = %q, want %q", in, got, want)
		}
	}
	fd := compileAgent(t, filepath.Join(repoRoot, "api/proto"))
	for _, m := range fd.MessageType {
		for _, f := range m.Field {
			if f.JsonName == nil {
				t.Fatalf("%s.%s has no json_name", m.GetName(), f.GetName())
			}
		}
	}
}

func TestUnquotePythonBytes(t *testing.T) {
	got, err := unquotePythonBytes(`a\x00\n\'\\\"\101z`)
	if err != nil {
		t.Fatal(err)
	}
	if want := []byte("a\x00\n'\\\"Az"); !bytes.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	if _, err := unquotePythonBytes(`\x4`); err == nil {
		t.Fatal("a short \\x escape was accepted")
	}
}
