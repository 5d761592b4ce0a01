// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package bytesize reads byte counts from flags the way Kubernetes reads quantities, so "2G" means the same
// (2·10⁹ bytes) in every command and in a TransferPool, and "2Gi" is 2·2³⁰.
package bytesize

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Parse reads a positive, whole number of bytes of at most max: a Kubernetes quantity (4096, 4Ki, 1Mi, 2Gi;
// 4k, 2G and 1e6 are decimal), optionally with a B after the unit or alone (4KiB, 1MiB, 9B).
func Parse(s string, max uint64) (uint64, error) {
	q := strings.TrimSpace(s)
	if strings.HasSuffix(q, "iB") || (strings.HasSuffix(q, "B") && !strings.HasSuffix(q, "iB")) {
		q = strings.TrimSuffix(q, "B")
	}
	bad := func(why string) error {
		return fmt.Errorf("size %q: %s (want a positive whole number of bytes such as 4096, 4Ki, 1Mi, 2Gi or 2G)", s, why)
	}
	if strings.HasSuffix(q, "K") {
		return 0, bad("K is not a unit; Ki is 1024 and k is 1000")
	}
	qty, err := resource.ParseQuantity(q)
	if err != nil {
		return 0, bad("not a quantity")
	}
	if qty.CmpInt64(1<<62) > 0 {
		return 0, bad("too large") // before Value, which clamps what does not fit an int64
	}
	n := qty.Value() // rounds a fraction up
	if qty.Cmp(*resource.NewQuantity(n, resource.BinarySI)) != 0 {
		return 0, bad("not a whole number of bytes")
	}
	if n <= 0 {
		return 0, bad("not positive")
	}
	if max > 0 && uint64(n) > max {
		return 0, bad(fmt.Sprintf("more than %d", max))
	}
	return uint64(n), nil
}
