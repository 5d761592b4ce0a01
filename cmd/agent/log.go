// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"fmt"
	"io"
	"time"
)

// stdLogger is the sink stdr writes through: one timestamped line per entry on stderr.
type stdLogger struct{ w io.Writer }

func (l stdLogger) Output(_ int, s string) error {
	_, err := fmt.Fprintf(l.w, "%s %s\n", time.Now().UTC().Format(time.RFC3339), s)
	return err
}
