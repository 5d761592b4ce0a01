// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"context"
	"fmt"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// socketDirRefused is the CRD's message for a socketDir outside the admin's prefix or not in normal form.
const socketDirRefused = "socketDir must be /var/run/fabricxfer or a directory under it"

// TestAdmissionRefusesHostilePools applies objects that would be root on a node, write nonsense flags, or
// produce owned objects the API server refuses later, and checks that admission refuses each with a message
// that names the field; the valid objects beside them must still be accepted, so the rules are not simply
// refusing everything.
// socketGroupRefused is the CRD's message for a socketGroup out of bounds.
const socketGroupRefused = "socketGroup must be a group ID between 1 and 2147483647"

func TestAdmissionRefusesHostilePools(t *testing.T) {
	c := apiClient(t)
	ns := newNamespace(t, c)
	named := func(name, spec string) string {
		return "apiVersion: fabricxfer.io/v1alpha1\nkind: TransferPool\nmetadata: {name: '" + name + "', namespace: " + ns + "}\nspec:\n" + spec
	}
	pool := func(spec string) string { return named("hostile", spec) }
	vpod := func(spec string) string {
		return "apiVersion: fabricxfer.io/v1alpha1\nkind: VPodTopology\nmetadata: {name: hostile-vpod}\nspec:\n" + spec
	}
	const accepted = ""
	cases := []struct {
		name, object, want string
	}{
		// Quantities become 64-bit byte counts in agent flags and a memory limit.
		{"perGPU 2^63", pool("  memory: {perGPU: '9223372036854775808'}"), "memory.perGPU must be 0 or between 2Mi and 1Ti"},
		{"perGPU 8Ei", pool("  memory: {perGPU: 8Ei}"), "memory.perGPU must be 0 or between 2Mi and 1Ti"},
		{"perGPU 1e100", pool("  memory: {perGPU: '1e100'}"), "memory.perGPU must be 0 or between 2Mi and 1Ti"},
		{"perGPU a millibyte", pool("  memory: {perGPU: 1m}"), "memory.perGPU must be 0 or between 2Mi and 1Ti"},
		{"perGPU with a fraction of a byte", pool("  memory: {perGPU: 2097152500m}"), "memory.perGPU must be a whole number of bytes"},
		{"perGPU 1Ki", pool("  memory: {perGPU: 1Ki}"), "memory.perGPU must be 0 or between 2Mi and 1Ti"},
		{"perGPU 2Ti", pool("  memory: {perGPU: 2Ti}"), "memory.perGPU must be 0 or between 2Mi and 1Ti"},
		{"perGPU 2^63-1", pool("  memory: {perGPU: '9223372036854775807'}"), "memory.perGPU must be 0 or between 2Mi and 1Ti"},
		{"hostStaging 100Pi", pool("  memory: {hostStaging: 100Pi}"), "memory.hostStaging must be between 1Mi and 1Ti"},
		{"hostStaging one byte", pool("  memory: {hostStaging: '1'}"), "memory.hostStaging must be between 1Mi and 1Ti"},
		{"hostStaging fractional", pool("  memory: {hostStaging: 1.5Ki}"), "memory.hostStaging must be between 1Mi and 1Ti"},
		{"hostStaging with a fraction of a byte", pool("  memory: {hostStaging: '1048576.5'}"), "memory.hostStaging must be a whole number of bytes"},
		{"hostStaging a decimal number of bytes", pool("  memory: {hostStaging: 1.5Gi}"), accepted},
		{"maxRegisteredPerCaller -1Gi", pool("  memory: {maxRegisteredPerCaller: -1Gi}"), "memory.maxRegisteredPerCaller must be between 1Mi and 16Ti"},
		{"maxRegisteredPerCaller 0", pool("  memory: {maxRegisteredPerCaller: '0'}"), "memory.maxRegisteredPerCaller must be between 1Mi and 16Ti"},
		{"maxRegisteredPerCaller 1m", pool("  memory: {maxRegisteredPerCaller: 1m}"), "memory.maxRegisteredPerCaller must be between 1Mi and 16Ti"},
		{"maxRegisteredPerCaller with a fraction of a byte", pool("  memory: {maxRegisteredPerCaller: 1.0000001Gi}"), "memory.maxRegisteredPerCaller must be a whole number of bytes"},
		{"memory at its bounds", pool("  memory: {perGPU: 1Ti, hostStaging: 1Mi, maxRegisteredPerCaller: 16Ti}"), accepted},
		{"memory as plain integers", pool("  memory: {perGPU: 0, hostStaging: 1073741824}"), accepted},
		{"memory as a fractional YAML number", pool("  memory: {hostStaging: 1048576.5}"), "spec.memory.hostStaging in body must be of type integer,string"},
		{"1-byte memory limit", pool("  agent: {resources: {limits: {memory: '1'}}}"), "agent.resources memory must be a whole number of bytes between 64Mi and 2Ti"},
		{"millibyte memory request", pool("  agent: {resources: {requests: {memory: 100Mi, cpu: 100m}, limits: {memory: 1000m}}}"), "agent.resources memory must be a whole number of bytes"},
		{"no CPU", pool("  agent: {resources: {requests: {cpu: '0'}}}"), "agent.resources cpu must be between 10m and 256"},
		{"requests above limits", pool("  agent: {resources: {requests: {memory: 2Gi}, limits: {memory: 1Gi}}}"), "agent.resources requests must not exceed limits"},
		{"agent takes the GPUs", pool("  agent: {resources: {limits: {nvidia.com/gpu: 8}}}"), "agent.resources may name only cpu, memory and ephemeral-storage"},
		{"agent claims a device", pool("  agent: {resources: {claims: [{name: gpu}]}}"), "agent.resources.claims is not supported"},
		{"agent resources in bounds", pool("  agent: {resources: {requests: {cpu: 100m, memory: 128Mi}, limits: {memory: 4Gi}}}"), accepted},

		// socketDir is mounted read-write, created when missing: only the admin's prefix, in normal form.
		{"socketDir /etc", pool("  socketDir: /etc"), socketDirRefused},
		{"socketDir //", pool("  socketDir: //"), socketDirRefused},
		{"socketDir /.", pool("  socketDir: /."), socketDirRefused},
		{"socketDir /root/.ssh", pool("  socketDir: /root/.ssh"), socketDirRefused},
		{"socketDir /proc/sys/kernel", pool("  socketDir: /proc/sys/kernel"), socketDirRefused},
		{"socketDir climbing out", pool("  socketDir: /var/run/fabricxfer/../../../etc"), socketDirRefused},
		{"socketDir with a dot segment", pool("  socketDir: /var/run/fabricxfer/./a"), socketDirRefused},
		{"socketDir with a double slash", pool("  socketDir: /var/run/fabricxfer//a"), socketDirRefused},
		{"socketDir with a trailing slash", pool("  socketDir: /var/run/fabricxfer/"), socketDirRefused},
		{"socketDir beside the prefix", pool("  socketDir: /var/run/fabricxfer-evil"), socketDirRefused},
		{"socketDir hidden under the prefix", pool("  socketDir: /var/run/fabricxfer/.ssh"), socketDirRefused},
		{"socketDir under the prefix", pool("  socketDir: /var/run/fabricxfer/team-a.v2"), accepted},

		// socketGroup becomes a chown of the socket directory: a group a pod's supplementalGroups can name, never root's.
		{"socketGroup 0", pool("  socketGroup: 0"), socketGroupRefused},
		{"socketGroup -1", pool("  socketGroup: -1"), socketGroupRefused},
		{"socketGroup 2^31", pool("  socketGroup: 2147483648"), socketGroupRefused},
		{"socketGroup 2^32-1", pool("  socketGroup: 4294967295"), socketGroupRefused},
		{"socketGroup -2^63", pool("  socketGroup: -9223372036854775808"), "spec.socketGroup in body must be of type int64"},
		{"socketGroup 1e30", pool("  socketGroup: 1e30"), "spec.socketGroup in body must be of type int64"},
		{"socketGroup as a string", pool("  socketGroup: '4242'"), "spec.socketGroup in body must be of type integer"},
		{"socketGroup with a fraction", pool("  socketGroup: 4242.5"), "spec.socketGroup in body must be of type int64"},
		{"socketGroup 1", pool("  socketGroup: 1"), accepted},
		{"socketGroup 2^31-1", pool("  socketGroup: 2147483647"), accepted},

		// Names, ports and references that cannot make valid owned objects.
		{"pool name too long", named(strings.Repeat("p", 64), "  engines: [tcp]"), "a TransferPool's name must be a DNS label"},
		{"pool name with a dot", named("a.b", "  engines: [tcp]"), "a TransferPool's name must be a DNS label"},
		{"pool name of 63 characters", named(strings.Repeat("p", 63), "  engines: [tcp]"), accepted},
		{"port without room for data and health", pool("  agent: {port: 65534}"), "spec.agent.port in body should be less than or equal to 65533"},
		{"image that is no reference", pool("  agent: {image: 'not a ref!'}"), "agent.image must be an image reference"},
		{"image with upper case repository", pool("  agent: {image: 'registry.local/Agent:v1'}"), "agent.image must be an image reference"},
		{"image with two tags", pool("  agent: {image: 'agent:v1:v2'}"), "agent.image must be an image reference"},
		{"image with a short digest", pool("  agent: {image: 'agent@sha256:abc'}"), "agent.image must be an image reference"},
		{"image with registry, port, tag and digest", pool("  agent: {image: 'registry.local:5000/fx/agent:v1@sha256:" + strings.Repeat("a", 64) + "'}"), accepted},
		{"node selector key with a space", pool("  nodeSelector: {'gpu node': 'true'}"), "nodeSelector keys must be label keys"},
		{"node selector value too long", pool("  nodeSelector: {gpu: '" + strings.Repeat("v", 64) + "'}"), "nodeSelector values must be label values"},
		{"node selector value not a label value", pool("  nodeSelector: {gpu: '-x-'}"), accepted},
		{"toleration operator", pool("  tolerations: [{key: a, operator: Sometimes}]"), "a toleration's operator must be Exists or Equal"},
		{"toleration effect", pool("  tolerations: [{key: a, operator: Exists, effect: Never}]"), "a toleration's effect must be NoSchedule, PreferNoSchedule or NoExecute"},
		{"toleration without key", pool("  tolerations: [{operator: Equal, value: x}]"), "a toleration without a key must have operator Exists"},
		{"priority class name", pool("  agent: {priorityClassName: Node_Critical}"), "spec.agent.priorityClassName in body should match"},

		// VPodTopology members that name no Node or no GPU.
		{"vpod member GPU -1", vpod("  kind: ualink\n  domain: 'ualink:9/9'\n  members: [{node: n1, gpus: [-1]}]"), "should be greater than or equal to 0"},
		{"vpod member not a node name", vpod("  kind: ualink\n  domain: 'ualink:9/9'\n  members: [{node: Node_1}]"), "spec.members[0].node in body should match"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			obj := &unstructured.Unstructured{}
			if err := yaml.Unmarshal([]byte(tc.object), &obj.Object); err != nil {
				t.Fatalf("test object does not parse: %v", err)
			}
			// Accepted pools are deleted through the operator's finalizer, which takes a moment: every case
			// gets a name of its own.
			if obj.GetName() == "hostile" || obj.GetName() == "hostile-vpod" {
				obj.SetName(fmt.Sprintf("%s-%d", obj.GetName(), i))
			}
			err := c.Create(ctx, obj)
			if err == nil {
				// An accepted pool selects every node: it must be gone before another test's pool comes,
				// or it would be the first pool of those nodes.
				_ = c.Delete(ctx, obj)
				eventually(t, settle, "the accepted object deleted", func() error {
					if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj.DeepCopy()); !apierrors.IsNotFound(err) {
						return fmt.Errorf("still there: %v", err)
					}
					return nil
				})
			}
			switch {
			case tc.want == accepted && err != nil:
				t.Fatalf("a valid object was refused: %v", err)
			case tc.want == accepted:
			case err == nil:
				t.Fatalf("the API server accepted %s", tc.name)
			case !strings.Contains(err.Error(), tc.want):
				t.Fatalf("refused with %q, want a message containing %q", err, tc.want)
			}
		})
	}
}
