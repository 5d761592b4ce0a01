// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

// cluster is the real kube-apiserver + etcd every test in this package shares, with the operator running.
type cluster struct {
	client client.Client
	cfg    *rest.Config
	skip   string
}

// testAgentNamespace is the operator's own namespace in config/rbac, where it runs agents.
const testAgentNamespace = DefaultAgentNamespace

// operatorUser is the operator's ServiceAccount as config/rbac names it.
const operatorUser = "system:serviceaccount:" + testAgentNamespace + ":fabricxfer-operator"

// testAgentSettings are the operator's settings in these tests; the allowlist admits one more image.
var testAgentSettings = AgentSettings{Image: "example.com/agent:test", ImageAllowlist: []string{"example.com/agent-dev:*"},
	Namespace: testAgentNamespace, NodeCerts: true}

// installRBAC creates the operator's namespace and applies config/rbac as `kubectl apply -f config/rbac` would.
func installRBAC(ctx context.Context, c client.Client) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testAgentNamespace}}
	if err := c.Create(ctx, ns); err != nil {
		return fmt.Errorf("creating namespace %s: %w", testAgentNamespace, err)
	}
	files, err := filepath.Glob(filepath.Join("..", "config", "rbac", "*.yaml"))
	if err != nil {
		return fmt.Errorf("listing config/rbac: %w", err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("reading %s: %w", f, err)
		}
		for _, doc := range strings.Split(string(data), "\n---") {
			obj := &unstructured.Unstructured{}
			if err := yaml.Unmarshal([]byte(doc), &obj.Object); err != nil {
				return fmt.Errorf("parsing %s: %w", f, err)
			}
			if len(obj.Object) == 0 {
				continue
			}
			if err := c.Create(ctx, obj); err != nil {
				return fmt.Errorf("creating %s %s from %s: %w", obj.GetKind(), obj.GetName(), f, err)
			}
		}
	}
	return nil
}

var testCluster cluster

func TestMain(m *testing.M) {
	os.Exit(runSuite(m))
}

func runSuite(m *testing.M) int {
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		assets = filepath.Join("..", "bin")
	}
	if _, err := os.Stat(filepath.Join(assets, "kube-apiserver")); err != nil {
		testCluster.skip = fmt.Sprintf("kube-apiserver not built (%v): run make tools", err)
		return m.Run()
	}
	ctrl.SetLogger(zap.New(zap.UseDevMode(false), zap.WriteTo(os.Stderr), zap.Level(zapLevel())))
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{filepath.Join("..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		// A loaded 2-core CI machine can take longer than envtest's default 20 s to bring the API server up.
		ControlPlaneStartTimeout: 2 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	cfg, err := env.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting envtest:", err)
		return 1
	}
	defer func() { _ = env.Stop() }()

	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(fxv1.AddToScheme(scheme))
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		fmt.Fprintln(os.Stderr, "creating client:", err)
		return 1
	}
	// The operator runs as its ServiceAccount with exactly the RBAC that config/rbac installs, so a missing
	// permission fails these tests and a needless one is visible in TestOperatorAndAgentRBAC.
	if err := installRBAC(context.Background(), c); err != nil {
		fmt.Fprintln(os.Stderr, "installing the operator's RBAC:", err)
		return 1
	}
	opCfg := rest.CopyConfig(cfg)
	opCfg.Impersonate = rest.ImpersonationConfig{UserName: operatorUser,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + testAgentNamespace, "system:authenticated"}}
	mgr, err := ctrl.NewManager(opCfg, ctrl.Options{Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"},
		Cache: cache.Options{ByObject: CacheByObject(testAgentNamespace)}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "creating manager:", err)
		return 1
	}
	pools := &TransferPoolReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Scheme: scheme, Agent: testAgentSettings,
		Recorder: mgr.GetEventRecorder(EventRecorderName)}
	issuer := NewCertIssuer(mgr.GetClient())
	if err := (&NodeCertReconciler{Client: mgr.GetClient(), Agent: testAgentSettings, Issuer: issuer}).SetupWithManager(mgr); err != nil {
		fmt.Fprintln(os.Stderr, "setting up the node certificate signer:", err)
		return 1
	}
	if err := (&PoolCertReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Agent: testAgentSettings, Issuer: issuer,
		Recorder: mgr.GetEventRecorder(EventRecorderName)}).SetupWithManager(mgr); err != nil {
		fmt.Fprintln(os.Stderr, "setting up the pool certificate controller:", err)
		return 1
	}
	if err := (&PoolAgentsReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Agent: testAgentSettings,
		Recorder: mgr.GetEventRecorder(EventRecorderName)}).SetupWithManager(mgr); err != nil {
		fmt.Fprintln(os.Stderr, "setting up pool agents:", err)
		return 1
	}
	if err := pools.SetupWithManager(mgr); err != nil {
		fmt.Fprintln(os.Stderr, "setting up pools:", err)
		return 1
	}
	if err := (&VPodTopologyReconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder(EventRecorderName)}).SetupWithManager(mgr); err != nil {
		fmt.Fprintln(os.Stderr, "setting up vpods:", err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	testCluster.client = c
	testCluster.cfg = cfg
	return m.Run()
}

func zapLevel() zapcore.Level {
	if os.Getenv("TEST_OPERATOR_LOGS") != "" {
		return zapcore.DebugLevel
	}
	return zapcore.ErrorLevel // reconcile conflicts during tests are expected and retried
}

// apiClient returns the shared client or skips the test with the reason the cluster is missing.
func apiClient(t *testing.T) client.Client {
	t.Helper()
	if testCluster.skip != "" {
		t.Skip(testCluster.skip)
	}
	return testCluster.client
}

// eventually polls check until it returns nil or the deadline passes, then fails with the last error.
func eventually(t *testing.T, timeout time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		if err = check(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s: not true after %s: %v", what, timeout, err)
}
