// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

// --log-format=json writes the operator's keys (ts in RFC 3339, a lowercase level, logger, msg, error), and
// --log-level filters by severity and by logr verbosity.
func TestLogFlagsWriteTheOperatorsKeys(t *testing.T) {
	var buf bytes.Buffer
	log, err := logFlags{format: "json", level: "info"}.logger(&buf)
	if err != nil {
		t.Fatal(err)
	}
	log.WithName("transfer").Error(errors.New("boom"), "socket failed", "pool", "kv")
	log.V(1).Info("hidden at info")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("%d lines at info, want 1:\n%s", len(lines), buf.String())
	}
	var entry map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &entry); err != nil {
		t.Fatal(err)
	}
	if entry["level"] != "error" || entry["logger"] != "transfer" || entry["msg"] != "socket failed" ||
		entry["error"] != "boom" || entry["pool"] != "kv" {
		t.Errorf("entry %v", entry)
	}
	if ts, _ := entry["ts"].(string); ts == "" {
		t.Errorf("no ts in %v", entry)
	} else if _, err := time.Parse(time.RFC3339Nano, ts); err != nil {
		t.Errorf("ts %q: %v", ts, err)
	}

	buf.Reset()
	log, _ = logFlags{format: "text", level: "debug"}.logger(&buf)
	log.V(1).Info("shown at debug")
	if !strings.Contains(buf.String(), "level=debug") || !strings.Contains(buf.String(), `msg="shown at debug"`) {
		t.Errorf("text at debug: %q", buf.String())
	}
	for _, bad := range []logFlags{{format: "xml"}, {format: "json", level: "loud"}, {level: "-1"}} {
		if _, err := bad.logger(&buf); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
