// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Command operator runs the fabricxfer operator: one agent DaemonSet per TransferPool (with its certificates),
// pool status from agent reports, and VPodTopology objects from the scale-up domains agents detect.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/metadata"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/controllers"
	"github.com/fabricxfer/fabricxfer/controllers/vpoddra"
)

// version is set at build time (-ldflags "-X main.version=..."; make images does).
var version = "dev"

func main() {
	if len(os.Args) == 2 && os.Args[1] == "version" {
		fmt.Println(version)
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "operator:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		metricsAddr    = flag.String("metrics-bind-address", ":8080", "address of the Prometheus metrics endpoint (0 disables it)")
		probeAddr      = flag.String("health-probe-bind-address", ":8081", "address of /healthz and /readyz")
		leaderElect    = flag.Bool("leader-elect", true, "elect one active operator among replicas")
		leaderNS       = flag.String("leader-election-namespace", "", "namespace of the leader lease (default: the pod's namespace)")
		agentImage     = flag.String("agent-image", "ghcr.io/fabricxfer/agent:v0.1.0", "agent image for pools that name none")
		pprofAddr      = flag.String("pprof-bind-address", "", "address of Go's /debug/pprof endpoints (empty: off)")
		issueAgentCert = flag.Bool("issue-agent-certs", true, "keep each pool's agent-to-agent CA and sign each agent's own certificate, naming its node (off: the admin puts a pool-wide tls.crt, tls.key and ca.crt into each pool's <agent>-tls Secret)")
		imageAllowlist = flag.String("agent-image-allowlist", "", "comma-separated agent images pools may name besides --agent-image; an entry ending in * allows every image that starts with the rest")
		agentNamespace = flag.String("agent-namespace", defaultAgentNamespace(), "namespace of every pool's agents, their ServiceAccounts and certificates; never a tenant's (default: the pod's namespace, else "+controllers.DefaultAgentNamespace+")")
		agentDRA       = flag.Bool("agent-dra", false, "run each agent's fabricxfer.io DRA driver: ResourceSlices of its node and claim preparation for the kubelet (needs resource.k8s.io/v1)")
		socketPrefix   = flag.String("socket-dir-prefix", fxv1.DefaultSocketDir, "host directory every pool's socketDir must be or lie under (the CRD's rule must say the same)")
		mpsPipeDir     = flag.String("agent-mps-pipe-dir", "", "host folder of the NVIDIA MPS control daemon's pipes (its CUDA_MPS_PIPE_DIRECTORY): the agents join MPS, so their GPU copies run beside the pods' kernels (empty: no MPS)")
		mpsShmDir      = flag.String("agent-mps-shm-dir", "", "host folder the MPS server and its clients share as /dev/shm, mounted there in the agents (empty: the host's /dev/shm)")
		vpodDevices    = flag.Int("dra-vpod-devices", vpoddra.DefaultDevices, "fabricxfer.io DRA devices published per VPodTopology, bound to its nodes (0: none)")
	)
	// JSON with ts in RFC 3339 by default, as the agents' --log-format=json writes (--zap-time-encoding changes it).
	opts := zap.Options{TimeEncoder: zapcore.RFC3339NanoTimeEncoder}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	if err := controllers.ValidateSocketDirPrefix(*socketPrefix); err != nil {
		return fmt.Errorf("--socket-dir-prefix: %w", err)
	}
	if err := controllers.ValidateMPSDirs(*mpsPipeDir, *mpsShmDir); err != nil {
		return fmt.Errorf("--agent-mps-pipe-dir, --agent-mps-shm-dir: %w", err)
	}
	agent := controllers.AgentSettings{Image: *agentImage, SocketDirPrefix: *socketPrefix, Namespace: *agentNamespace, DRA: *agentDRA,
		NodeCerts: *issueAgentCert, MPSPipeDir: *mpsPipeDir, MPSShmDir: *mpsShmDir}
	for _, image := range strings.Split(*imageAllowlist, ",") {
		if image = strings.TrimSpace(image); image != "" {
			agent.ImageAllowlist = append(agent.ImageAllowlist, image)
		}
	}

	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(fxv1.AddToScheme(scheme))

	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("loading kubeconfig: %w", err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        scheme,
		Metrics:                       metricsserver.Options{BindAddress: *metricsAddr},
		HealthProbeBindAddress:        *probeAddr,
		LeaderElection:                *leaderElect,
		LeaderElectionID:              "fabricxfer-operator.fabricxfer.io",
		LeaderElectionNamespace:       *leaderNS,
		LeaderElectionReleaseOnCancel: true,
		PprofBindAddress:              *pprofAddr,
		// Cache only what the operator owns: agents' heartbeat Leases, and DaemonSets, ServiceAccounts, Secrets
		// and RBAC objects it made, not every one of the cluster.
		Cache: cache.Options{ByObject: controllers.CacheByObject(*agentNamespace)},
	})
	if err != nil {
		return fmt.Errorf("creating manager: %w", err)
	}
	// One controller per concern, each writing its own condition of a pool: the aggregate status (nodes
	// reporting), the agents' objects (AgentsReady), the certificates (CertificatesReady).
	pools := &controllers.TransferPoolReconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Scheme:    scheme,
		Agent:     agent,
		Recorder:  mgr.GetEventRecorder(controllers.EventRecorderName),
	}
	agents := &controllers.PoolAgentsReconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Agent:     agent,
		Recorder:  mgr.GetEventRecorder(controllers.EventRecorderName),
	}
	// The certificate controller runs either way: with issuing off it only lets go pools that carry its
	// finalizer from a run that issued.
	certs := &controllers.PoolCertReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Agent: agent,
		Recorder: mgr.GetEventRecorder(controllers.EventRecorderName)}
	if *issueAgentCert {
		issuer := controllers.NewCertIssuer(mgr.GetClient())
		certs.Issuer = issuer
		if err := (&controllers.NodeCertReconciler{Client: mgr.GetClient(), Agent: agent, Issuer: issuer}).SetupWithManager(mgr); err != nil {
			return fmt.Errorf("setting up the node certificate signer: %w", err)
		}
	}
	if err := certs.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the pool certificate controller: %w", err)
	}
	if err := agents.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the pool agents controller: %w", err)
	}
	if err := pools.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the TransferPool controller: %w", err)
	}
	if err := (&controllers.VPodTopologyReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(),
		Recorder: mgr.GetEventRecorder(controllers.EventRecorderName)}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the VPodTopology controller: %w", err)
	}
	if *vpodDevices > 0 {
		kube, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return fmt.Errorf("creating the vPOD ResourceSlice client: %w", err)
		}
		meta, err := metadata.NewForConfig(cfg)
		if err != nil {
			return fmt.Errorf("creating the vPOD ResourceSlice metadata client: %w", err)
		}
		if err := (&vpoddra.Publisher{Kube: kube, Metadata: meta, Client: mgr.GetClient(), Devices: *vpodDevices}).SetupWithManager(mgr); err != nil {
			return fmt.Errorf("setting up the vPOD ResourceSlice publisher: %w", err)
		}
	}
	// Counts of pools, reports and domains, read from the cache at scrape time, beside controller-runtime's
	// reconcile durations and work queue metrics.
	ctrlmetrics.Registry.MustRegister(controllers.Metrics{Reader: mgr.GetClient()})
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return fmt.Errorf("adding health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return fmt.Errorf("adding readiness check: %w", err)
	}
	ctrl.Log.Info("starting operator", "leaderElection", *leaderElect)
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		return fmt.Errorf("running manager: %w", err)
	}
	return nil
}

// defaultAgentNamespace is the operator's own namespace when it runs in a pod (POD_NAMESPACE, set by the chart
// and config/manager), so agents sit beside the operator.
func defaultAgentNamespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	return controllers.DefaultAgentNamespace
}
