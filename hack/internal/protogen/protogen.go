// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package protogen

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/bufbuild/protocompile"
	"github.com/bufbuild/protocompile/linker"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/pluginpb"
)

// Plugin is one code generator run the way protoc runs it: the executable reads a CodeGeneratorRequest on
// stdin and writes a CodeGeneratorResponse on stdout.
type Plugin struct {
	// Path is the plugin executable (protoc-gen-go, protoc-gen-go-grpc).
	Path string
	// Parameter is what protoc passes as --<name>_opt (e.g. "module=github.com/x/y").
	Parameter string
}

// Compile parses and links files (paths relative to importRoot) with the standard imports protoc ships, and
// returns every file the request needs, dependencies first, as protoc hands them to plugins: with source code
// info (comments) and a json_name on every field.
func Compile(ctx context.Context, importRoot string, files []string) ([]*descriptorpb.FileDescriptorProto, error) {
	c := protocompile.Compiler{
		Resolver:       protocompile.WithStandardImports(&protocompile.SourceResolver{ImportPaths: []string{importRoot}}),
		SourceInfoMode: protocompile.SourceInfoStandard,
	}
	linked, err := c.Compile(ctx, files...)
	if err != nil {
		return nil, fmt.Errorf("compiling %s: %w", strings.Join(files, ", "), err)
	}
	var out []*descriptorpb.FileDescriptorProto
	seen := map[string]bool{}
	var add func(fd protoreflect.FileDescriptor)
	add = func(fd protoreflect.FileDescriptor) {
		if seen[fd.Path()] {
			return
		}
		seen[fd.Path()] = true
		imports := fd.Imports()
		for i := 0; i < imports.Len(); i++ {
			add(imports.Get(i).FileDescriptor)
		}
		var fdp *descriptorpb.FileDescriptorProto
		if r, ok := fd.(linker.Result); ok {
			fdp = proto.Clone(r.FileDescriptorProto()).(*descriptorpb.FileDescriptorProto)
		} else {
			fdp = protodesc.ToFileDescriptorProto(fd)
		}
		setJSONNames(fdp)
		out = append(out, fdp)
	}
	for _, f := range linked {
		add(f)
	}
	return out, nil
}

// setJSONNames fills json_name on every field, as protoc does in the descriptors it gives plugins.
func setJSONNames(fdp *descriptorpb.FileDescriptorProto) {
	var walk func(msgs []*descriptorpb.DescriptorProto)
	walk = func(msgs []*descriptorpb.DescriptorProto) {
		for _, m := range msgs {
			for _, f := range m.Field {
				if f.JsonName == nil {
					f.JsonName = proto.String(jsonName(f.GetName()))
				}
			}
			for _, f := range m.Extension {
				if f.JsonName == nil {
					f.JsonName = proto.String(jsonName(f.GetName()))
				}
			}
			walk(m.NestedType)
		}
	}
	walk(fdp.MessageType)
	for _, f := range fdp.Extension {
		if f.JsonName == nil {
			f.JsonName = proto.String(jsonName(f.GetName()))
		}
	}
}

// jsonName is protoc's ToJsonName: underscores dropped, the letter after one upper-cased.
func jsonName(name string) string {
	var b strings.Builder
	upper := false
	for _, r := range name {
		switch {
		case r == '_':
			upper = true
		case upper && 'a' <= r && r <= 'z':
			b.WriteRune(r - 'a' + 'A')
			upper = false
		default:
			b.WriteRune(r)
			upper = false
		}
	}
	return b.String()
}

// Generate runs plugin on the files to generate (a subset of all, by path) and writes its output under outDir.
// It returns the paths written, relative to outDir.
func Generate(ctx context.Context, all []*descriptorpb.FileDescriptorProto, generate []string, plugin Plugin, outDir string) ([]string, error) {
	req := &pluginpb.CodeGeneratorRequest{FileToGenerate: generate, ProtoFile: all}
	if plugin.Parameter != "" {
		req.Parameter = proto.String(plugin.Parameter)
	}
	in, err := proto.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encoding the request for %s: %w", plugin.Path, err)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, plugin.Path)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(in), &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("running %s: %w: %s", plugin.Path, err, strings.TrimSpace(stderr.String()))
	}
	var resp pluginpb.CodeGeneratorResponse
	if err := proto.Unmarshal(stdout.Bytes(), &resp); err != nil {
		return nil, fmt.Errorf("decoding the answer of %s: %w", plugin.Path, err)
	}
	if resp.Error != nil {
		return nil, fmt.Errorf("%s: %s", plugin.Path, resp.GetError())
	}
	var written []string
	for _, f := range resp.File {
		if f.GetInsertionPoint() != "" {
			return nil, fmt.Errorf("%s: insertion points are not supported (%s)", plugin.Path, f.GetName())
		}
		name := filepath.Clean(f.GetName())
		if filepath.IsAbs(name) || strings.HasPrefix(name, "..") {
			return nil, fmt.Errorf("%s wants to write %q outside the output folder", plugin.Path, f.GetName())
		}
		path := filepath.Join(outDir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return nil, fmt.Errorf("writing %s: %w", path, err)
		}
		if err := os.WriteFile(path, []byte(f.GetContent()), 0o644); err != nil {
			return nil, fmt.Errorf("writing %s: %w", path, err)
		}
		written = append(written, name)
	}
	return written, nil
}

var serializedFile = regexp.MustCompile(`AddSerializedFile\(b'((?:[^'\\]|\\.)*)'\)`)

// CheckPythonDescriptor compares the descriptor embedded in a protoc-generated Python module (the bytes passed to
// AddSerializedFile) with want, the file as compiled here, so stale Python messages are caught where protoc
// itself is not installed.
func CheckPythonDescriptor(pyPath string, want *descriptorpb.FileDescriptorProto) error {
	src, err := os.ReadFile(pyPath)
	if err != nil {
		return fmt.Errorf("reading %s: %w", pyPath, err)
	}
	m := serializedFile.FindSubmatch(src)
	if m == nil {
		return fmt.Errorf("%s: no AddSerializedFile(b'...') found", pyPath)
	}
	raw, err := unquotePythonBytes(string(m[1]))
	if err != nil {
		return fmt.Errorf("%s: %w", pyPath, err)
	}
	var got descriptorpb.FileDescriptorProto
	if err := proto.Unmarshal(raw, &got); err != nil {
		return fmt.Errorf("%s: decoding the embedded descriptor: %w", pyPath, err)
	}
	w := proto.Clone(want).(*descriptorpb.FileDescriptorProto)
	w.SourceCodeInfo = nil
	clearJSONNames(w)
	clearJSONNames(&got)
	if !proto.Equal(&got, w) {
		return fmt.Errorf("%s is out of date with %s (run hack/gen-proto.sh where protoc is installed)", pyPath, want.GetName())
	}
	return nil
}

func clearJSONNames(fdp *descriptorpb.FileDescriptorProto) {
	var walk func(msgs []*descriptorpb.DescriptorProto)
	walk = func(msgs []*descriptorpb.DescriptorProto) {
		for _, m := range msgs {
			for _, f := range m.Field {
				f.JsonName = nil
			}
			walk(m.NestedType)
		}
	}
	walk(fdp.MessageType)
}

// unquotePythonBytes decodes the body of a Python bytes literal written with single quotes, as Python's repr
// writes it (\xNN, \n, \r, \t, \\, \', \" and octal escapes).
func unquotePythonBytes(s string) ([]byte, error) {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' {
			out = append(out, c)
			continue
		}
		i++
		if i >= len(s) {
			return nil, errors.New("bytes literal ends inside an escape")
		}
		switch e := s[i]; e {
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case '\\', '\'', '"':
			out = append(out, e)
		case 'x':
			if i+3 > len(s) {
				return nil, errors.New("short \\x escape")
			}
			v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
			if err != nil {
				return nil, fmt.Errorf("bad \\x escape %q: %w", s[i:i+3], err)
			}
			out = append(out, byte(v))
			i += 2
		default:
			if e < '0' || e > '7' {
				return nil, fmt.Errorf("unknown escape \\%c", e)
			}
			j := i
			for j < len(s) && j < i+3 && s[j] >= '0' && s[j] <= '7' {
				j++
			}
			v, err := strconv.ParseUint(s[i:j], 8, 8)
			if err != nil {
				return nil, fmt.Errorf("bad octal escape %q: %w", s[i:j], err)
			}
			out = append(out, byte(v))
			i = j - 1
		}
	}
	return out, nil
}

// PythonCheck names a checked-in protoc-generated Python module and the .proto file it came from.
type PythonCheck struct {
	Proto  string
	Module string
}

// Options is one generation run.
type Options struct {
	ProtoRoot    string
	OutDir       string
	GoOpt        string
	PluginGo     string
	PluginGoGRPC string
	Files        []string
	PythonChecks []PythonCheck
}

// Run compiles the files, writes the Go messages and gRPC stubs under OutDir and checks the Python modules.
func Run(ctx context.Context, o Options) error {
	all, err := Compile(ctx, o.ProtoRoot, o.Files)
	if err != nil {
		return err
	}
	for _, p := range []string{o.PluginGo, o.PluginGoGRPC} {
		if _, err := Generate(ctx, all, o.Files, Plugin{Path: p, Parameter: o.GoOpt}, o.OutDir); err != nil {
			return err
		}
	}
	byName := map[string]*descriptorpb.FileDescriptorProto{}
	for _, f := range all {
		byName[f.GetName()] = f
	}
	for _, c := range o.PythonChecks {
		f, ok := byName[c.Proto]
		if !ok {
			return fmt.Errorf("-check-python names %s, which is not among the compiled files", c.Proto)
		}
		if err := CheckPythonDescriptor(c.Module, f); err != nil {
			return err
		}
		if grpcPy := strings.TrimSuffix(c.Module, "_pb2.py") + "_pb2_grpc.py"; len(f.Service) > 0 {
			if err := CheckPythonGRPC(grpcPy, f); err != nil {
				return err
			}
		}
	}
	return nil
}

var methodPath = regexp.MustCompile(`'(/[A-Za-z0-9_.]+/[A-Za-z0-9_]+)'`)

// CheckPythonGRPC checks that a checked-in grpc_python stub module names exactly the methods of the file's
// services (its other content follows from the messages, which CheckPythonDescriptor covers).
func CheckPythonGRPC(pyPath string, want *descriptorpb.FileDescriptorProto) error {
	src, err := os.ReadFile(pyPath)
	if err != nil {
		return fmt.Errorf("reading %s: %w", pyPath, err)
	}
	got := map[string]bool{}
	for _, m := range methodPath.FindAllSubmatch(src, -1) {
		got[string(m[1])] = true
	}
	wantSet := map[string]bool{}
	for _, svc := range want.Service {
		for _, m := range svc.Method {
			wantSet["/"+want.GetPackage()+"."+svc.GetName()+"/"+m.GetName()] = true
		}
	}
	var missing, extra []string
	for m := range wantSet {
		if !got[m] {
			missing = append(missing, m)
		}
	}
	for m := range got {
		if !wantSet[m] {
			extra = append(extra, m)
		}
	}
	if len(missing)+len(extra) > 0 {
		sort.Strings(missing)
		sort.Strings(extra)
		return fmt.Errorf("%s is out of date with %s: missing methods %v, unknown methods %v (run hack/gen-proto.sh where protoc is installed)",
			pyPath, want.GetName(), missing, extra)
	}
	return nil
}
