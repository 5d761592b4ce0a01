// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package promtest

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Sample is one series of a scrape: its metric's name, its labels in the order the registry gives them (by
// name), and its value: a counter's or gauge's value, a histogram's sample count.
type Sample struct {
	Name   string
	Labels []Label
	Value  float64
}

// Label is one label of a Sample.
type Label struct{ Name, Value string }

// Samples scrapes reg, failing t when it cannot.
func Samples(t testing.TB, reg prometheus.Gatherer) []Sample {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []Sample
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			s := Sample{Name: mf.GetName(), Value: value(m)}
			for _, l := range m.GetLabel() {
				s.Labels = append(s.Labels, Label{l.GetName(), l.GetValue()})
			}
			out = append(out, s)
		}
	}
	return out
}

// Gather scrapes reg into "name{label=value,...}" -> value ("name{}" without labels).
func Gather(t testing.TB, reg prometheus.Gatherer) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, s := range Samples(t, reg) {
		ls := make([]string, len(s.Labels))
		for i, l := range s.Labels {
			ls[i] = l.Name + "=" + l.Value
		}
		out[s.Name+"{"+strings.Join(ls, ",")+"}"] = s.Value
	}
	return out
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Histogram != nil:
		return float64(m.GetHistogram().GetSampleCount())
	}
	return 0
}
