// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package node

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fabricxfer/fabricxfer/agent/peers"
	"github.com/fabricxfer/fabricxfer/agent/server"
	"github.com/fabricxfer/fabricxfer/controllers"
	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/xgmi"
)

var (
	fqName     = regexp.MustCompile(`fqName: "([a-z0-9_]+)"`)
	metricName = regexp.MustCompile(`\bfabricxfer_[a-z0-9_]+`)
)

// exportedMetrics are the names of every metric an agent or the operator serves under fabricxfer_ (from the collectors'
// descriptions, so series not charged yet count too), with the histograms among them.
func exportedMetrics(t *testing.T) (names map[string]bool, histograms map[string]bool) {
	t.Helper()
	x, err := xgmi.New(xgmi.Options{Node: "n"}, xgmi.NewHostBackend())
	if err != nil {
		t.Fatal(err)
	}
	m := engines.NewMetrics()
	comp, err := engines.NewComposite(engines.CompositeOptions{Node: "n", Metrics: m}, x)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Options{SocketDir: t.TempDir(), PoolNamespace: "ns", PoolName: "p", NodeName: "n", Engine: comp})
	if err != nil {
		t.Fatal(err)
	}
	names = map[string]bool{}
	for _, c := range []prometheus.Collector{m, srv.Collector(), (&peers.Peers{}).Collector(), controllers.Metrics{},
		controllers.DomainEventsDropped(prometheus.NewRegistry()), controllers.AgentEventsDropped(prometheus.NewRegistry()), fabricMappedGauge(nil),
		newGPUCopierCollector(func() []gpuCopier { return nil })} {
		ch := make(chan *prometheus.Desc, 64)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			if sub := fqName.FindStringSubmatch(d.String()); sub != nil {
				names[sub[1]] = true
			}
		}
	}
	return names, map[string]bool{"fabricxfer_transfer_duration_seconds": true}
}

// base is the metric a query names: a histogram's _bucket, _sum and _count series are the histogram's.
func base(name string, histograms map[string]bool) string {
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if b, ok := strings.CutSuffix(name, suffix); ok && histograms[b] {
			return b
		}
	}
	return name
}

// The dashboard, the alerts and docs/observability.md name only metrics the agent exports, and the document
// lists every one of them, so none of the three can drift from the code.
func TestDashboardAlertsAndDocsNameOnlyExportedMetrics(t *testing.T) {
	names, histograms := exportedMetrics(t)
	if len(names) < 15 {
		t.Fatalf("only %d metrics found: %v", len(names), names)
	}
	root := filepath.Join("..", "..")
	files := []string{"docs/grafana/fabricxfer-engines.json", "charts/fabricxfer/templates/prometheusrule.yaml", "docs/observability.md"}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		used := map[string]bool{}
		for _, n := range metricName.FindAllString(string(b), -1) {
			if strings.HasSuffix(n, "_") { // a prefix in prose (fabricxfer_agent_*)
				continue
			}
			used[base(n, histograms)] = true
		}
		if len(used) == 0 {
			t.Errorf("%s names no metric", f)
		}
		for n := range used {
			if !names[n] {
				t.Errorf("%s names %s, which neither the agent nor the operator exports", f, n)
			}
		}
		if f == "docs/observability.md" {
			for n := range names {
				if !used[n] {
					t.Errorf("%s does not document %s", f, n)
				}
			}
		}
	}
	// Every alert expression has balanced brackets and quotes (no PromQL parser in this module's graph).
	b, _ := os.ReadFile(filepath.Join(root, "charts/fabricxfer/templates/prometheusrule.yaml"))
	exprs := regexp.MustCompile(`(?ms)expr: (?:\|-\n)?(.*?)\n\s+for:`).FindAllStringSubmatch(string(b), -1)
	if len(exprs) < 5 {
		t.Fatalf("%d alert expressions found, want 5", len(exprs))
	}
	for _, e := range exprs {
		expr := regexp.MustCompile(`\{\{[^}]*\}\}`).ReplaceAllString(e[1], "X") // template actions
		var stack []rune
		pairs := map[rune]rune{')': '(', ']': '[', '}': '{'}
		for _, r := range expr {
			switch r {
			case '(', '[', '{':
				stack = append(stack, r)
			case ')', ']', '}':
				if len(stack) == 0 || stack[len(stack)-1] != pairs[r] {
					t.Errorf("unbalanced %q in %s", r, e[1])
				} else {
					stack = stack[:len(stack)-1]
				}
			}
		}
		if len(stack) > 0 || strings.Count(expr, `"`)%2 != 0 {
			t.Errorf("unbalanced brackets or quotes in %s", e[1])
		}
	}
}
