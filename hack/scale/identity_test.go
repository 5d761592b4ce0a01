// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/controllers"
)

// The token hack/scale.sh makes must name the very ServiceAccount the operator binds the agents' rights to,
// or the simulated agents would be refused (or, named otherwise, measure another identity).
func TestAgentUserIsTheOperatorsServiceAccount(t *testing.T) {
	for _, tc := range []struct{ poolNS, pool, agentNS string }{
		{"default", "scale", controllers.DefaultAgentNamespace},
		{"team-a", "a-very-long-pool-name-that-gets-cut", "gpu-agents"},
	} {
		pool := &v1alpha1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: tc.poolNS, Name: tc.pool}}
		settings := controllers.AgentSettings{Namespace: tc.agentNS}
		sa := controllers.DesiredServiceAccount(pool, settings)
		crb := controllers.DesiredClusterRoleBinding(pool, settings)
		want := "system:serviceaccount:" + *sa.Namespace + ":" + *sa.Name
		got := agentUser(options{poolNamespace: tc.poolNS, poolName: tc.pool, agentNamespace: tc.agentNS})
		if got != want {
			t.Errorf("pool %s/%s, agents in %s: agentUser = %q, the operator's ServiceAccount is %q", tc.poolNS, tc.pool, tc.agentNS, got, want)
		}
		if s := crb.Subjects[0]; *s.Kind != "ServiceAccount" || "system:serviceaccount:"+*s.Namespace+":"+*s.Name != got {
			t.Errorf("pool %s/%s: the ClusterRoleBinding's subject %s/%s is not %q", tc.poolNS, tc.pool, *s.Namespace, *s.Name, got)
		}
	}
}
