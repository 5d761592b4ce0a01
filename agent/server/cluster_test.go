// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"google.golang.org/grpc/codes"

	"github.com/fabricxfer/fabricxfer/agent/server/identity"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/internal/fdpass"
)

// startAPIServer runs a real kube-apiserver + etcd (envtest) with the fabricxfer CRDs.
func startAPIServer(t *testing.T) ctrlclient.Client {
	t.Helper()
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		assets = filepath.Join("..", "..", "bin")
	}
	if _, err := os.Stat(filepath.Join(assets, "kube-apiserver")); err != nil {
		t.Skip("kube-apiserver not built: run make tools")
	}
	env := &envtest.Environment{BinaryAssetsDirectory: assets, ErrorIfCRDPathMissing: true,
		CRDDirectoryPaths: []string{filepath.Join("..", "..", "config", "crd", "bases")}}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting the API server: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := fxv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := ctrlclient.New(cfg, ctrlclient.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func createPod(t *testing.T, c ctrlclient.Client, ns, name, node string) string {
	t.Helper()
	ctx := ctxT(t)
	_ = c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "engine", Image: "example.com/vllm:test"}}}}
	if err := c.Create(ctx, pod); err != nil {
		t.Fatalf("creating pod %s/%s: %v", ns, name, err)
	}
	return string(pod.UID)
}

// TestCallersIdentifiedThroughTheAPIServer: pods are real API objects; the agent finds a caller's namespace from
// its cgroup's pod UID and the pool's TransferPool decides who may connect.
func TestCallersIdentifiedThroughTheAPIServer(t *testing.T) {
	kube := startAPIServer(t)
	ctx := ctxT(t)
	podA := createPod(t, kube, "infer", "prefill-0", "node-a")
	podB := createPod(t, kube, "infer", "decode-0", "node-a")
	podOther := createPod(t, kube, "other-team", "intruder", "node-a")
	pool := &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: "infer", Name: "kv"}}
	if err := kube.Create(ctx, pool); err != nil {
		t.Fatalf("creating the TransferPool: %v", err)
	}

	proc := newProcFixture(t)
	opts := baseOptions(t, proc)
	opts.Identifier = identity.Identifier{ProcRoot: proc.root, Pods: &identity.APIPodResolver{Reader: kube, NodeName: "node-a"}}
	opts.Policy = &identity.APIPoolPolicy{Reader: kube, Namespace: "infer", Name: "kv", TTL: 50 * time.Millisecond}
	a := startAgent(t, opts)

	t.Run("a namespace the pool does not allow is refused", func(t *testing.T) {
		proc.setPod(t, podOther)
		_, err := client.Dial(ctx, a.srv.SocketPath())
		if client.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `namespace "other-team" may not use pool infer/kv`) {
			t.Fatalf("dial from other-team: %v, want PermissionDenied naming the namespace and pool", err)
		}
		// The fd socket refuses it too, and closes the descriptor it was sent.
		m := shm(t, 4096)
		if _, err := fdpass.Put(ctx, a.srv.FDSocketPath(), m.File); err == nil || !strings.Contains(err.Error(), "other-team") {
			t.Fatalf("fd socket from other-team: %v, want a refusal", err)
		}
	})

	t.Run("a local process is refused without allow-local", func(t *testing.T) {
		proc.setLocal(t)
		_, err := client.Dial(ctx, a.srv.SocketPath())
		if client.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "not in a Kubernetes pod") {
			t.Fatalf("dial from outside any pod: %v", err)
		}
	})

	proc.setPod(t, podA)
	ca := dial(t, a)
	if ca.Info().Caller.Namespace != "infer" || ca.Info().Caller.PodName != "prefill-0" {
		t.Fatalf("caller A identified as %v", ca.Info().Caller)
	}
	proc.setPod(t, podB)
	cb := dial(t, a)
	if cb.Info().Caller.PodName != "decode-0" {
		t.Fatalf("caller B identified as %v", cb.Info().Caller)
	}
	ma, mb := shm(t, 8192), shm(t, 8192)
	fill(t, ma.Bytes)
	fill(t, mb.Bytes)
	keepB := append([]byte(nil), mb.Bytes...)
	proc.setPod(t, podA) // fd socket connections are identified on their own
	ra, err := ca.RegisterHost(ctx, ma.File, 0, 8192)
	if err != nil {
		t.Fatal(err)
	}
	proc.setPod(t, podB)
	rb, err := cb.RegisterHost(ctx, mb.File, 0, 8192)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("a caller cannot touch another caller's region", func(t *testing.T) {
		// B names A's region as its local side, as its remote side, and tries to deregister it.
		for name, req := range map[string]*agentv1.TransferRequest{
			"as local": {Op: agentv1.Op_OP_READ, Items: []*agentv1.TransferItem{{LocalRegionId: ra.ID(), Length: 8192,
				Remote: &agentv1.RemoteRef{Target: &agentv1.RemoteRef_RegionId{RegionId: rb.ID()}}}}},
			"as remote": {Op: agentv1.Op_OP_WRITE, Items: []*agentv1.TransferItem{{LocalRegionId: rb.ID(), Length: 8192,
				Remote: &agentv1.RemoteRef{Target: &agentv1.RemoteRef_RegionId{RegionId: ra.ID()}}}}},
		} {
			if _, err := cb.API().Transfer(ctx, req); client.Code(err) != codes.NotFound {
				t.Errorf("B using A's region %s: %v, want NotFound", name, err)
			}
		}
		if _, err := cb.API().DeregisterMemory(ctx, &agentv1.DeregisterMemoryRequest{RegionId: ra.ID()}); client.Code(err) != codes.NotFound {
			t.Errorf("B deregistering A's region: %v, want NotFound", err)
		}
		// A token A obtained is of no use to B.
		proc.setPod(t, podA)
		token, err := fdpass.Put(ctx, a.srv.FDSocketPath(), ma.File)
		if err != nil {
			t.Fatal(err)
		}
		_, err = cb.API().RegisterMemory(ctx, &agentv1.RegisterMemoryRequest{Kind: agentv1.MemoryKind_MEMORY_KIND_HOST,
			HandleType: agentv1.HandleType_HANDLE_TYPE_SHM_FD, FdToken: token, Length: 4096})
		if client.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "not yours") {
			t.Errorf("B registering with A's fd token: %v", err)
		}
		if string(mb.Bytes) != string(keepB) {
			t.Error("B's memory changed")
		}
	})

	t.Run("a descriptor grants access", func(t *testing.T) {
		// A hands B its region's descriptor (out of band, as an inference engine shares KV metadata).
		if _, err := cb.Read(ctx, rb, 0, client.ToDescriptor(ra.Descriptor()), 0, 8192); err != nil {
			t.Fatalf("B reading A's region through its descriptor: %v", err)
		}
		if string(mb.Bytes) != string(ma.Bytes) {
			t.Fatal("B's copy differs from A's memory")
		}
		forged := append([]byte(nil), ra.Descriptor()...)
		forged[len(forged)-1] ^= 0xff // damage the wire descriptor: refused, not misread
		if _, err := cb.Read(ctx, rb, 0, client.ToDescriptor(forged), 0, 8192); err == nil {
			t.Fatal("a damaged descriptor was accepted")
		}
	})

	t.Run("allowedNamespaces edits apply to new connections", func(t *testing.T) {
		var p fxv1.TransferPool
		if err := kube.Get(ctx, ctrlclient.ObjectKeyFromObject(pool), &p); err != nil {
			t.Fatal(err)
		}
		p.Spec.AllowedNamespaces = []string{"*"}
		if err := kube.Update(ctx, &p); err != nil {
			t.Fatal(err)
		}
		proc.setPod(t, podOther)
		deadline := time.Now().Add(5 * time.Second)
		for {
			c, err := client.Dial(context.Background(), a.srv.SocketPath())
			if err == nil {
				c.Close()
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("other-team still refused after allowedNamespaces became *: %v", err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}
