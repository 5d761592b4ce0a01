// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package node

import (
	"errors"
	"strings"
	"testing"

	"github.com/fabricxfer/fabricxfer/agent/server"
)

// TestGPUSharingSaysWhetherCopiesWaitForOtherProcesses: the statement GetInfo carries for the same-node engine
// follows the driver's MPS attribute of every GPU, and a driver that cannot answer is reported, not guessed.
func TestGPUSharingSaysWhetherCopiesWaitForOtherProcesses(t *testing.T) {
	count := func(n int) func() (int, error) { return func() (int, error) { return n, nil } }
	mpsOn := func(ordinals ...int) func(int) (int, error) {
		return func(i int) (int, error) {
			for _, o := range ordinals {
				if o == i {
					return 1, nil
				}
			}
			return 0, nil
		}
	}
	for _, tc := range []struct {
		name  string
		count func() (int, error)
		mps   func(int) (int, error)
		want  []string
		not   []string
	}{
		{"every GPU through MPS", count(8), mpsOn(0, 1, 2, 3, 4, 5, 6, 7),
			[]string{"shared through MPS", "beside other processes' kernels"}, []string{"timeslice", "of 8"}},
		{"no MPS", count(8), mpsOn(),
			[]string{"time-sliced with other processes (no MPS)", "waits for its timeslice"}, []string{"shared through MPS"}},
		{"some GPUs through MPS", count(4), mpsOn(1, 3),
			[]string{"shared through MPS on CUDA GPUs 1,3 of 4", "the others time-sliced"}, nil},
		{"no GPU", count(0), mpsOn(), []string{"no NVIDIA GPU visible"}, []string{"MPS"}},
		{"count fails", func() (int, error) { return 0, errors.New("CUDA_ERROR_NOT_INITIALIZED") }, mpsOn(),
			[]string{"GPU sharing unknown: counting GPUs: CUDA_ERROR_NOT_INITIALIZED"}, nil},
		{"attribute unknown to an old driver", count(2), func(i int) (int, error) {
			if i == 1 {
				return 0, errors.New("cuDeviceGetAttribute(133): CUDA_ERROR_INVALID_VALUE")
			}
			return 1, nil
		}, []string{"GPU sharing unknown: reading whether GPU 1 runs under MPS: cuDeviceGetAttribute(133)"}, []string{"shared through"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := gpuSharing(tc.count, tc.mps)
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("%q does not say %q", got, w)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(got, n) {
					t.Errorf("%q says %q", got, n)
				}
			}
		})
	}
}

// TestGPUSharingInSameNodeEngineStatus: GetInfo's same-node engine carries the sharing statement after what
// detection found (and after why a GPU backend is missing); other engines do not.
func TestGPUSharingInSameNodeEngineStatus(t *testing.T) {
	t.Parallel()
	side := &transferSide{
		statuses: []server.EngineStatus{
			{Name: "xgmi", Available: true, Reason: "8 GPUs, 28 NVLink peer pairs; same-GPU copies always"},
			{Name: "rdma", Available: false, Reason: "no RDMA device"},
		},
		gpuSharing: "GPUs time-sliced with other processes (no MPS): while another process computes on a GPU, each copy waits for its timeslice",
	}
	side.markNotRunning(Config{DisableTCP: true}, false)
	want := "8 GPUs, 28 NVLink peer pairs; same-GPU copies always; " + side.gpuSharing
	if got := side.statuses[0].Reason; got != want {
		t.Errorf("xgmi reason %q, want %q", got, want)
	}
	if got := side.statuses[1].Reason; strings.Contains(got, "MPS") {
		t.Errorf("rdma reason %q carries the GPU sharing", got)
	}
}

// TestSameNodeEngineWithoutGPUsSaysHostMemory: on a node without GPUs detection finds no same-node GPU path, but
// the engine runs with its host backend and moves host memory: GetInfo reports it available, for host memory
// only, with detection's reason, so a caller that checks availability first does not give up.
func TestSameNodeEngineWithoutGPUsSaysHostMemory(t *testing.T) {
	t.Parallel()
	side := &transferSide{statuses: []server.EngineStatus{
		{Name: "xgmi", Available: false, Reason: "no GPU detected"},
		{Name: "rdma", Available: false, Reason: "no RDMA device"},
	}}
	side.markNotRunning(Config{DisableTCP: true}, false)
	if got := side.statuses[0]; !got.Available || got.Reason != "host memory only (no GPU detected)" {
		t.Errorf("xgmi without GPUs: %+v, want available for host memory only", got)
	}
	if side.statuses[1].Available {
		t.Error("rdma became available")
	}
}
