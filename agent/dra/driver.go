// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package dra

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	v1alpha1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/topology"
)

// Config is one node's DRA driver.
type Config struct {
	NodeName      string
	PoolNamespace string
	PoolName      string
	// HostSocketDir is the pool's socket directory on the host (<spec.socketDir>/<pool>), which prepared claims
	// mount into containers.
	HostSocketDir string
	// Channels is how many devices the node publishes (DefaultChannels when 0, at most 128).
	Channels int
	// CDIDir receives the CDI specs of prepared claims (kubeletplugin.DefaultCDIDir when empty).
	CDIDir string
	// PluginDir holds the plugin's gRPC socket dra.sock, which the kubelet calls
	// (/var/lib/kubelet/plugins/fabricxfer.io when empty).
	PluginDir string
	// RegistryDir is the kubelet's plugin registry, where the plugin announces itself
	// (/var/lib/kubelet/plugins_registry when empty).
	RegistryDir string
	// Kube is the API client the slices are written and claims read with.
	Kube kubernetes.Interface
	// Detect reads the node; the slices follow it every Period.
	Detect func(ctx context.Context) (topology.Report, error)
	Period time.Duration
	// Kick, when set, makes the driver publish at once when it receives (what Detect returns changed: the
	// agent's engines were assembled), not a Period later.
	Kick <-chan struct{}
	Log  logr.Logger
	// AdmitNamespace refuses a namespace the pool does not admit (its spec.allowedNamespaces): that namespace's
	// pods would be refused by the socket anyway, and its claims must not hold the node's channels. Nil admits
	// every namespace.
	AdmitNamespace func(ctx context.Context, namespace string) error
}

// apiReadLimit bounds each API read Prepare makes (a holder's claim, a vPOD pool's slice, the namespaces the pool
// admits): it holds the driver's lock meanwhile, so a stalled API server must not stop every Prepare and Unprepare
// of the node for longer.
const apiReadLimit = 10 * time.Second

// Driver is the node's DRA driver: it publishes the node's ResourceSlice and serves the kubelet's
// NodePrepareResources and NodeUnprepareResources. Run it as one of the agent's components.
type Driver struct {
	cfg   Config
	cdi   cdiStore
	mu    sync.Mutex // serializes Prepare and Unprepare (the helper does too; tests call them directly)
	facts *Facts     // the last published facts, under mu
	ready chan struct{}
	sock  string
}

// New checks cfg and fills its defaults.
func New(cfg Config) (*Driver, error) {
	switch {
	case cfg.NodeName == "":
		return nil, errors.New("dra: NodeName is required")
	case cfg.HostSocketDir == "":
		return nil, errors.New("dra: HostSocketDir is required")
	case cfg.Kube == nil:
		return nil, errors.New("dra: Kube is required")
	case cfg.Detect == nil:
		return nil, errors.New("dra: Detect is required")
	case cfg.Channels < 0 || cfg.Channels > resourceapi.ResourceSliceMaxDevices:
		return nil, fmt.Errorf("dra: %d channels: want 1 to %d", cfg.Channels, resourceapi.ResourceSliceMaxDevices)
	}
	if cfg.Channels == 0 {
		cfg.Channels = DefaultChannels
	}
	if cfg.CDIDir == "" {
		cfg.CDIDir = kubeletplugin.DefaultCDIDir
	}
	if cfg.PluginDir == "" {
		cfg.PluginDir = filepath.Join(kubeletplugin.KubeletPluginsDir, DriverName)
	}
	if cfg.RegistryDir == "" {
		cfg.RegistryDir = kubeletplugin.KubeletRegistryDir
	}
	if cfg.Period <= 0 {
		cfg.Period = 10 * time.Second
	}
	return &Driver{cfg: cfg, cdi: cdiStore{dir: cfg.CDIDir, log: cfg.Log}, ready: make(chan struct{}), sock: filepath.Join(cfg.PluginDir, "dra.sock")}, nil
}

// PluginSocket is the plugin's gRPC socket, the one the kubelet dials.
func (d *Driver) PluginSocket() string { return d.sock }

// Ready is closed once the plugin's socket serves and the first slice was handed to the publisher.
func (d *Driver) Ready() <-chan struct{} { return d.ready }

// Run serves the kubelet plugin and keeps the node's ResourceSlice equal to what detection reports, until ctx
// ends; then it stops serving and deletes the node's slices, so they go with the agent (and with its pool).
func (d *Driver) Run(ctx context.Context) error {
	for _, dir := range []string{d.cfg.PluginDir, d.cfg.RegistryDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return fmt.Errorf("creating the kubelet plugin directory: %w", err)
		}
	}
	helper, err := kubeletplugin.Start(ctx, plugin{d},
		kubeletplugin.DriverName(DriverName),
		kubeletplugin.KubeClient(d.cfg.Kube),
		kubeletplugin.NodeName(d.cfg.NodeName),
		kubeletplugin.PluginDataDirectoryPath(d.cfg.PluginDir),
		kubeletplugin.RegistrarDirectoryPath(d.cfg.RegistryDir),
		kubeletplugin.CDIDirectory(d.cfg.CDIDir),
	)
	if err != nil {
		return fmt.Errorf("starting the DRA kubelet plugin: %w", err)
	}
	var last *Facts
	publish := func() {
		rep, err := d.cfg.Detect(ctx)
		if err != nil {
			d.cfg.Log.Error(err, "detection failed; the ResourceSlice keeps its last devices")
			return
		}
		f := FactsFrom(d.cfg.NodeName, d.cfg.PoolNamespace, d.cfg.PoolName, rep)
		if last != nil && reflect.DeepEqual(*last, f) {
			return
		}
		res := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
			PoolName(d.cfg.NodeName): {Slices: []resourceslice.Slice{{Devices: Devices(f, d.cfg.Channels)}}},
		}}
		if err := helper.PublishResources(ctx, res); err != nil {
			d.cfg.Log.Error(err, "publishing the ResourceSlice")
			return
		}
		d.cfg.Log.Info("ResourceSlice devices published", "channels", d.cfg.Channels, "gpus", f.GPUs, "domains", f.Domains)
		last = &f
		d.mu.Lock()
		d.facts = &f
		d.mu.Unlock()
	}
	publish()
	close(d.ready)
	t := time.NewTicker(d.cfg.Period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			helper.Stop()
			return d.deleteSlices()
		case <-t.C:
			publish()
		case <-d.cfg.Kick:
			publish()
		}
	}
}

// deleteSlices removes every ResourceSlice of this driver on this node.
func (d *Driver) deleteSlices() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sel := fields.Set{resourceapi.ResourceSliceSelectorDriver: DriverName, resourceapi.ResourceSliceSelectorNodeName: d.cfg.NodeName}.AsSelector().String()
	err := d.cfg.Kube.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		return fmt.Errorf("deleting the ResourceSlices of node %s: %w", d.cfg.NodeName, err)
	}
	return nil
}

// Prepare checks that each claim's devices of this driver are this node's (or a vPOD this node is in) and not
// held by another claim, writes the claim's CDI spec and returns the CDI device its containers get. It is
// idempotent. A claim that fails gets its reason; the others of the call go on.
func (d *Driver) Prepare(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	held, err := d.cdi.holders()
	if err != nil {
		return nil, err
	}
	vpods := newVPodPools(d.cfg.Kube)
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		devs, err := d.prepareOne(ctx, c, held, vpods)
		out[c.UID] = kubeletplugin.PrepareResult{Err: err, Devices: devs}
	}
	return out, nil
}

// prepareOne prepares one claim; held is updated with the devices it takes, so a later claim of the same call
// is refused them.
func (d *Driver) prepareOne(ctx context.Context, c *resourceapi.ResourceClaim, held map[string]holder, vpods *vpodPools) ([]kubeletplugin.Device, error) {
	ref := c.Namespace + "/" + c.Name
	if !validClaimUID(c.UID) {
		return nil, fmt.Errorf("claim %s: UID %.80q is not a Kubernetes UID", ref, string(c.UID))
	}
	if c.Status.Allocation == nil {
		return nil, fmt.Errorf("claim %s is not allocated", ref)
	}
	pool := PoolName(d.cfg.NodeName)
	var names []string
	var results, placement []resourceapi.DeviceRequestAllocationResult
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver != DriverName {
			continue
		}
		vpodPool := r.Pool
		if renamed, ok := v1alpha1.VPodDRAPoolOfLegacyName(r.Pool); ok && r.Pool != pool {
			vpodPool = renamed // allocated before the operator renamed its pools
		}
		if v1alpha1.IsVPodDRAPool(vpodPool) {
			// A vPOD device places pods; it needs nothing in the container.
			domain, err := vpods.domain(ctx, vpodPool, r.Device)
			if err != nil {
				return nil, fmt.Errorf("claim %s: device %s/%s: %w", ref, r.Pool, r.Device, err)
			}
			if d.facts == nil {
				// Prepare can come before the first detection is published (the agent just started): say so,
				// and the kubelet's retry finds it.
				return nil, fmt.Errorf("claim %s: device %s/%s: this node's fabric domains are not detected yet", ref, r.Pool, r.Device)
			}
			if !slices.Contains(d.facts.Domains, domain) { // this node's GPUs' domains decide the vPODs it is in
				return nil, fmt.Errorf("claim %s: device %s/%s is a vPOD this node is not in (its domain %s, this node's %v)", ref, r.Pool, r.Device, domain, d.facts.Domains)
			}
			placement = append(placement, r)
			continue
		}
		if r.Pool != pool {
			return nil, fmt.Errorf("claim %s: device %s/%s is not this node's (this agent serves pool %s)", ref, r.Pool, r.Device, pool)
		}
		if h, ok := held[r.Device]; ok && h.uid != c.UID {
			d.dropIfGone(ctx, h, held)
		}
		if h, ok := held[r.Device]; ok && h.uid != c.UID {
			// The refusal reaches the claim's pod events: another namespace's claim is not named there.
			holder := "a claim of another namespace"
			if ns, _, _ := strings.Cut(h.ref, "/"); ns == c.Namespace {
				holder = "claim " + h.ref
			}
			return nil, fmt.Errorf("claim %s: device %s is already prepared for %s", ref, r.Device, holder)
		}
		names = append(names, r.Device)
		results = append(results, r)
	}
	if len(results)+len(placement) == 0 {
		return nil, fmt.Errorf("claim %s has no device of driver %s", ref, DriverName)
	}
	var devs []kubeletplugin.Device
	for _, r := range placement {
		devs = append(devs, kubeletplugin.Device{Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device})
	}
	if len(results) == 0 {
		d.cfg.Log.Info("vPOD claim prepared", "claim", ref, "uid", c.UID)
		return devs, nil
	}
	if len(names) > 0 && d.cfg.AdmitNamespace != nil {
		actx, cancel := context.WithTimeout(ctx, apiReadLimit)
		err := d.cfg.AdmitNamespace(actx, c.Namespace)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("claim %s: %w", ref, err)
		}
	}
	if err := d.cdi.write(c.UID, ref, names, d.cfg.HostSocketDir); err != nil {
		return nil, err
	}
	for _, n := range names {
		held[n] = holder{uid: c.UID, ref: ref}
	}
	for _, r := range results {
		devs = append(devs, kubeletplugin.Device{
			Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device, CDIDeviceIDs: []string{CDIDeviceID(c.UID)},
		})
	}
	d.cfg.Log.Info("claim prepared", "claim", ref, "uid", c.UID, "devices", names)
	return devs, nil
}

// dropIfGone removes the spec of h, a claim holding a device another claim asks for, when h no longer exists in
// the API server (deleted, or replaced under its name): its Unprepare never came (the kubelet's state was lost,
// the agent was away), and its devices stayed held for good while the scheduler kept allocating them. h's
// devices then leave held.
func (d *Driver) dropIfGone(ctx context.Context, h holder, held map[string]holder) {
	ns, name, ok := strings.Cut(h.ref, "/")
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, apiReadLimit)
	defer cancel()
	cur, err := d.cfg.Kube.ResourceV1().ResourceClaims(ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case err == nil && cur.UID == h.uid:
		return // still there: it holds the device
	case err != nil && !apierrors.IsNotFound(err):
		d.cfg.Log.Info("could not tell whether a claim holding a device still exists", "claim", h.ref, "error", err.Error())
		return
	}
	if err := d.cdi.remove(h.uid, h.ref); err != nil {
		d.cfg.Log.Error(err, "dropping the spec of a claim that no longer exists", "claim", h.ref)
		return
	}
	for dev, other := range held {
		if other.uid == h.uid {
			delete(held, dev)
		}
	}
	d.cfg.Log.Info("dropped the spec of a claim that no longer exists, which held devices", "claim", h.ref, "uid", h.uid)
}

// Unprepare removes the claims' CDI specs; a claim not prepared here is not an error. A UID that is not one,
// or whose spec was prepared for another namespace/name, fails for that claim and removes nothing.
func (d *Driver) Unprepare(claims []kubeletplugin.NamespacedObject) map[types.UID]error {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		ref := c.NamespacedName.String()
		if err := d.cdi.remove(c.UID, ref); err != nil {
			d.cfg.Log.Error(err, "claim not unprepared", "claim", ref)
			out[c.UID] = err
			continue
		}
		out[c.UID] = nil
		d.cfg.Log.Info("claim unprepared", "claim", ref, "uid", c.UID)
	}
	return out
}

// plugin is the kubeletplugin.DRAPlugin face of the driver.
type plugin struct{ d *Driver }

func (p plugin) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	return p.d.Prepare(ctx, claims)
}

func (p plugin) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	return p.d.Unprepare(claims), nil
}

func (p plugin) HandleError(_ context.Context, err error, msg string) {
	p.d.cfg.Log.Error(err, msg)
}

func (p plugin) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}
