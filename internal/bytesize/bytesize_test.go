// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package bytesize

import "testing"

func TestParse(t *testing.T) {
	for in, want := range map[string]uint64{"720": 720, "4Ki": 4096, "4KiB": 4096, "1MiB": 1 << 20, "2Gi": 2 << 30,
		"2GiB": 2 << 30, "2G": 2e9, "4k": 4000, "9B": 9, "1e6": 1e6, "1.5Mi": 3 << 19, " 64Ki ": 64 << 10} {
		if got, err := Parse(in, 1<<40); err != nil || got != want {
			t.Errorf("Parse(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "0", "-1", "4K", "MiB", "1.5", "1.0001Ki", "99999999Gi", "8Ei", "1e100", "two"} {
		if n, err := Parse(bad, 1<<40); err == nil {
			t.Errorf("Parse(%q) = %d, accepted", bad, n)
		}
	}
}
