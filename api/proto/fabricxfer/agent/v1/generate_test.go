// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package agentv1_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestGeneratedCodeIsCurrent regenerates the protos into a scratch folder and fails when the checked-in code
// differs, so a .proto edit without regeneration (or a hand edit of generated code) cannot land unnoticed. Go
// code needs no protoc; without protoc the Python modules are checked against the compiled descriptors.
func TestGeneratedCodeIsCurrent(t *testing.T) {
	root, err := filepath.Abs("../../../../..")
	if err != nil {
		t.Fatalf("finding the repository root: %v", err)
	}
	for _, plugin := range []string{"protoc-gen-go", "protoc-gen-go-grpc"} {
		if _, err := os.Stat(filepath.Join(root, "bin", plugin)); err != nil {
			t.Skipf("bin/%s not built: run make tools", plugin)
		}
	}
	cmd := exec.Command(filepath.Join(root, "hack", "gen-proto.sh"), "--verify")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("generated code is stale: %v\n%s", err, out)
	}
}
