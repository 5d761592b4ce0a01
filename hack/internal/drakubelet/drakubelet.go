// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package drakubelet

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// Node is where one node's plugin socket and CDI specs are.
type Node struct {
	PluginSocket string
	CDIDir       string
}

// Options is one pod to start.
type Options struct {
	Kube      kubernetes.Interface
	Namespace string
	Pod       string
	// Nodes maps node names to their plugin and CDI directory.
	Nodes map[string]Node
	// Command runs "in the container"; Stdout and Stderr receive its output and this package's account.
	Command        []string
	Stdout, Stderr io.Writer
	Timeout        time.Duration
}

// Run waits for the pod to be bound, prepares its claims on its node and runs Command with the claims' CDI
// edits applied.
func Run(ctx context.Context, o Options) error {
	if o.Timeout <= 0 {
		o.Timeout = time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	var node string
	var claims []*drapb.Claim
	for {
		pod, err := o.Kube.CoreV1().Pods(o.Namespace).Get(ctx, o.Pod, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("reading pod %s/%s: %w", o.Namespace, o.Pod, err)
		}
		if pod.Spec.NodeName != "" {
			node = pod.Spec.NodeName
			for _, rc := range pod.Spec.ResourceClaims {
				name := ""
				if rc.ResourceClaimName != nil {
					name = *rc.ResourceClaimName
				}
				for _, st := range pod.Status.ResourceClaimStatuses {
					if st.Name == rc.Name && st.ResourceClaimName != nil {
						name = *st.ResourceClaimName
					}
				}
				if name == "" {
					return fmt.Errorf("pod %s/%s: claim %s has no ResourceClaim yet", o.Namespace, o.Pod, rc.Name)
				}
				c, err := o.Kube.ResourceV1().ResourceClaims(o.Namespace).Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					return fmt.Errorf("reading claim %s: %w", name, err)
				}
				claims = append(claims, &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)})
			}
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pod %s/%s not bound to a node: %w", o.Namespace, o.Pod, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
	n, ok := o.Nodes[node]
	if !ok {
		return fmt.Errorf("pod %s/%s is bound to %s, which has no plugin here", o.Namespace, o.Pod, node)
	}
	fmt.Fprintf(o.Stderr, "pod %s/%s bound to %s by the scheduler; preparing its claims there\n", o.Namespace, o.Pod, node)
	conn, err := grpc.NewClient("unix://"+n.PluginSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("dialing %s: %w", n.PluginSocket, err)
	}
	defer conn.Close()
	resp, err := drapb.NewDRAPluginClient(conn).NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: claims})
	if err != nil {
		return fmt.Errorf("NodePrepareResources on %s: %w", node, err)
	}
	var ids []string
	for _, c := range claims {
		r := resp.Claims[c.Uid]
		if r == nil || r.Error != "" {
			return fmt.Errorf("claim %s/%s not prepared on %s: %s", c.Namespace, c.Name, node, r.GetError())
		}
		for _, d := range r.Devices {
			ids = append(ids, d.CdiDeviceIds...)
		}
	}
	env, mounts, err := Edits(n.CDIDir, ids)
	if err != nil {
		return err
	}
	for _, m := range mounts {
		fmt.Fprintf(o.Stderr, "  CDI mount %s -> %s\n", m.HostPath, m.ContainerPath)
	}
	cmdEnv := os.Environ()
	for _, e := range env {
		k, v, _ := strings.Cut(e, "=")
		host := HostPath(v, mounts)
		fmt.Fprintf(o.Stderr, "  CDI env %s=%s (on the host: %s)\n", k, v, host)
		cmdEnv = append(cmdEnv, k+"="+host)
	}
	cmd := exec.CommandContext(ctx, o.Command[0], o.Command[1:]...)
	cmd.Env, cmd.Stdout, cmd.Stderr = cmdEnv, o.Stdout, o.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("running %s: %w", strings.Join(o.Command, " "), err)
	}
	return nil
}

// Edits reads the CDI specs in dir and returns the environment and mounts the named devices
// (kind=name) add, as a runtime would apply them.
func Edits(dir string, ids []string) (env []string, mounts []cdispec.Mount, err error) {
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, nil, fmt.Errorf("listing %s: %w", dir, err)
	}
	sort.Strings(files)
	found := map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, nil, fmt.Errorf("reading %s: %w", f, err)
		}
		var spec cdispec.Spec
		if err := json.Unmarshal(b, &spec); err != nil {
			return nil, nil, fmt.Errorf("%s is not a CDI spec: %w", f, err)
		}
		for _, d := range spec.Devices {
			id := spec.Kind + "=" + d.Name
			if !want[id] {
				continue
			}
			found[id] = true
			env = append(env, d.ContainerEdits.Env...)
			for _, m := range d.ContainerEdits.Mounts {
				mounts = append(mounts, *m)
			}
		}
	}
	for _, id := range ids {
		if !found[id] {
			return nil, nil, fmt.Errorf("CDI device %s: no spec in %s", id, dir)
		}
	}
	return env, mounts, nil
}

// HostPath maps a path inside the container to the host through the mounts (the longest mount prefix wins);
// a path no mount covers is returned unchanged.
func HostPath(p string, mounts []cdispec.Mount) string {
	best := -1
	for i, m := range mounts {
		cp := filepath.Clean(m.ContainerPath)
		if (p == cp || strings.HasPrefix(p, cp+"/")) && (best < 0 || len(cp) > len(filepath.Clean(mounts[best].ContainerPath))) {
			best = i
		}
	}
	if best < 0 {
		return p
	}
	m := mounts[best]
	return filepath.Join(m.HostPath, strings.TrimPrefix(p, filepath.Clean(m.ContainerPath)))
}
