// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package topology

import (
	"fmt"
	"testing"
)

// TestPartitionsShareUniqueID builds a GPU split in two partitions (two KFD nodes with one unique_id, as in
// CPX/DPX mode) next to an unpartitioned GPU.
func TestPartitionsShareUniqueID(t *testing.T) {
	files := map[string]string{
		kfdNodesDir + "/0/gpu_id":     "0\n",
		kfdNodesDir + "/0/properties": "cpu_cores_count 96\n",
	}
	gpu := func(node, bus int, unique uint64, partitionBits int) {
		files[fmt.Sprintf("%s/%d/gpu_id", kfdNodesDir, node)] = fmt.Sprintf("%d\n", 4000+node)
		// GFX 9.4.3 ORs the partition into the low bits of location_id; the BDF must not change.
		files[fmt.Sprintf("%s/%d/properties", kfdNodesDir, node)] = fmt.Sprintf(
			"vendor_id 4098\nlocation_id %d\ndomain 0\ndrm_render_minor %d\nlocal_mem_size 103079215104\nunique_id %d\n",
			bus<<8|partitionBits, 127+node, unique)
	}
	gpu(1, 0x0a, 598046273873802902, 0)
	gpu(2, 0x0a, 598046273873802902, 1)
	gpu(3, 0x8a, 111, 0)
	r, err := Detect(t.Context(), memHost{files: files}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.GPUs) != 3 {
		t.Fatalf("got %d GPUs, want 3 (two partitions and one GPU)", len(r.GPUs))
	}
	got := fmt.Sprintf("%s %d/%d, %s %d/%d, %s %d/%d",
		r.GPUs[0].PCIBusID, r.GPUs[0].Partition, r.GPUs[0].Partitions,
		r.GPUs[1].PCIBusID, r.GPUs[1].Partition, r.GPUs[1].Partitions,
		r.GPUs[2].PCIBusID, r.GPUs[2].Partition, r.GPUs[2].Partitions)
	if want := "0000:0a:00.0 0/2, 0000:0a:00.0 1/2, 0000:8a:00.0 0/0"; got != want {
		t.Errorf("partitions %s, want %s", got, want)
	}
}
