// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"testing"
)

func TestAPFReportCountsRejectionsAndWaits(t *testing.T) {
	before, err := parseAPF([]byte(`
apiserver_flowcontrol_dispatched_requests_total{flow_schema="service-accounts",priority_level="workload-low"} 10
apiserver_flowcontrol_request_wait_duration_seconds_bucket{execute="true",flow_schema="service-accounts",priority_level="workload-low",le="0.1"} 10
apiserver_flowcontrol_request_wait_duration_seconds_bucket{execute="true",flow_schema="service-accounts",priority_level="workload-low",le="1"} 10
apiserver_flowcontrol_request_wait_duration_seconds_bucket{execute="true",flow_schema="service-accounts",priority_level="workload-low",le="+Inf"} 10
`))
	if err != nil {
		t.Fatal(err)
	}
	after, err := parseAPF([]byte(`
apiserver_flowcontrol_dispatched_requests_total{flow_schema="exempt",priority_level="exempt"} 5
apiserver_flowcontrol_dispatched_requests_total{flow_schema="service-accounts",priority_level="workload-low"} 110
apiserver_flowcontrol_rejected_requests_total{flow_schema="service-accounts",priority_level="workload-low",reason="queue-full"} 7
apiserver_flowcontrol_request_wait_duration_seconds_bucket{execute="true",flow_schema="service-accounts",priority_level="workload-low",le="0.1"} 60
apiserver_flowcontrol_request_wait_duration_seconds_bucket{execute="true",flow_schema="service-accounts",priority_level="workload-low",le="1"} 110
apiserver_flowcontrol_request_wait_duration_seconds_bucket{execute="true",flow_schema="service-accounts",priority_level="workload-low",le="+Inf"} 110
apiserver_flowcontrol_request_wait_duration_seconds_bucket{execute="false",flow_schema="service-accounts",priority_level="workload-low",le="+Inf"} 7
apiserver_flowcontrol_request_wait_duration_seconds_bucket{execute="true",flow_schema="fabricxfer-agent-leases",priority_level="fabricxfer-agents",le="0.1"} 4
apiserver_flowcontrol_request_wait_duration_seconds_bucket{execute="true",flow_schema="fabricxfer-agent-leases",priority_level="fabricxfer-agents",le="1"} 4
apiserver_flowcontrol_request_wait_duration_seconds_bucket{execute="true",flow_schema="fabricxfer-agent-leases",priority_level="fabricxfer-agents",le="+Inf"} 4
apiserver_flowcontrol_dispatched_requests_total{flow_schema="fabricxfer-agent-leases",priority_level="fabricxfer-agents"} 4
apiserver_flowcontrol_nominal_limit_seats{priority_level="exempt"} 0
apiserver_flowcontrol_nominal_limit_seats{priority_level="fabricxfer-agents"} 46
apiserver_flowcontrol_nominal_limit_seats{priority_level="workload-low"} 227
apiserver_flowcontrol_nominal_limit_seats{priority_level="node-high"} 91
apiserver_flowcontrol_current_limit_seats{priority_level="exempt"} 75
apiserver_flowcontrol_current_limit_seats{priority_level="fabricxfer-agents"} 92
apiserver_flowcontrol_current_limit_seats{priority_level="workload-low"} 300
apiserver_flowcontrol_current_limit_seats{priority_level="node-high"} 80
`))
	if err != nil {
		t.Fatal(err)
	}
	reportHas(t, apfReport(before, after),
		"dispatched (priority level): exempt=5 fabricxfer-agents=4 workload-low=100",
		"rejected (priority level/flow schema/reason): workload-low/service-accounts/queue-full=7",
		// Only the levels that served requests; node-high served none.
		"seats at the end (priority level=nominal/current): exempt=0/75 fabricxfer-agents=46/92 workload-low=227/300\n",
		// 50 of the 100 executed waited under 0.1 s: the median is the first bucket's upper bound.
		"queue wait of executed requests (priority level/flow schema): workload-low/service-accounts n=100 p50 100 ms",
		"queue wait of executed requests (priority level/flow schema): fabricxfer-agents/fabricxfer-agent-leases n=4 p50 50 ms",
	)
}
