// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package vpoddra

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/errgroup"
	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

// The retry delays after a pass that could not write everything, and how many slices a pass writes at once.
// One: the slices place pods, while the vPOD reconciler's writes (64 in flight) decide when the pool and its
// vPODs are ready, and both share the API server; with 8 slice writes in flight make scale N=1000 converged no
// faster (docs/benchmarks.md).
const (
	parallelWrites = 1
	firstRetry     = time.Second
	lastRetry      = 30 * time.Second
)

// Publisher keeps the vPOD pools' ResourceSlices equal to the VPodTopologies. It is a manager Runnable (run by
// the leader only) and a reconciler of VPodTopology.
//
// It writes the slices itself instead of through k8s.io/dynamic-resource-allocation's slice controller, which
// keeps every published slice decoded in an informer and a second copy of the desired state: at 832 vPODs of
// 16 devices that was most of the operator's heap. The publisher watches the slices' metadata only and keeps,
// per pool, the UID and resourceVersion of its own last write and the spec it wrote (whose devices share one
// attribute map). A slice whose resourceVersion is not the publisher's own (someone else wrote it, or the
// operator restarted) is read once in full and rewritten when it differs; any other node-less slice of the
// driver is deleted, as the slice controller did.
type Publisher struct {
	Kube kubernetes.Interface
	// Metadata watches the slices' metadata.
	Metadata metadata.Interface
	Client   client.Reader
	Devices  int
	// Log receives publishing errors (the context's logger when unset).
	Log *logr.Logger
	// WriteLimit bounds the API calls that publish one pool or delete one slice (default 30 s): one write is in
	// flight at a time, so an API server (or a proxy) that never answers one must not stop every pool's.
	WriteLimit time.Duration

	mu      sync.Mutex
	wake    chan struct{}
	desired map[string]*resourceapi.ResourceSliceSpec // by slice name (vpod-<x>); replaced, never changed
	facts   map[string]string                         // by slice name, what its desired spec was built from
	refused map[string]string                         // pools that cannot be published, with the reason
	written map[string]writtenSlice                   // by slice name
}

// writtenSlice is what the publisher knows of a slice it wrote or read in full.
type writtenSlice struct {
	uid             types.UID
	resourceVersion string
	generation      int64
	spec            *resourceapi.ResourceSliceSpec // the desired spec it matched, generation left at 0
}

func (p *Publisher) wakeChannel() chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.wake == nil {
		p.wake = make(chan struct{}, 1)
	}
	return p.wake
}

// poke asks for a pass; passes asked for while one runs fold into one.
func (p *Publisher) poke() {
	select {
	case p.wakeChannel() <- struct{}{}:
	default:
	}
}

func (p *Publisher) logger(ctx context.Context) logr.Logger {
	if p.Log != nil {
		return *p.Log
	}
	return log.FromContext(ctx)
}

// sliceSelector picks the slices the publisher owns: its driver's and bound to no single node (the agents'
// slices name their node).
func sliceSelector() string {
	return fields.Set{resourceapi.ResourceSliceSelectorDriver: DriverName, resourceapi.ResourceSliceSelectorNodeName: ""}.String()
}

// Start watches the slices' metadata and publishes until ctx ends.
func (p *Publisher) Start(ctx context.Context) error {
	if p.Kube == nil || p.Metadata == nil {
		return errors.New("starting the vPOD ResourceSlice publisher: Kube and Metadata clients are required")
	}
	informer := metadatainformer.NewFilteredMetadataInformer(p.Metadata, resourceapi.SchemeGroupVersion.WithResource("resourceslices"), "", 0,
		cache.Indexers{}, func(o *metav1.ListOptions) { o.FieldSelector = sliceSelector() }).Informer()
	// Only names, UIDs and resourceVersions are read; managed fields list every device's every attribute.
	if err := informer.SetTransform(func(obj any) (any, error) {
		if m, ok := obj.(metav1.Object); ok {
			m.SetManagedFields(nil)
		}
		return obj, nil
	}); err != nil {
		return fmt.Errorf("setting the ResourceSlice metadata transform: %w", err)
	}
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    p.seen,
		UpdateFunc: func(_, obj any) { p.seen(obj) },
		DeleteFunc: func(any) { p.poke() },
	}); err != nil {
		return fmt.Errorf("watching vPOD ResourceSlices: %w", err)
	}
	go informer.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		return nil // ctx ended
	}
	p.poke()
	wake := p.wakeChannel()
	retry := firstRetry
	var timer <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		case <-timer:
		}
		timer = nil
		if err := p.sync(ctx, informer.GetStore()); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			p.logger(ctx).Error(err, "publishing vPOD ResourceSlices", "retryIn", retry.String())
			timer = time.After(retry)
			retry = min(2*retry, lastRetry)
			continue
		}
		retry = firstRetry
	}
}

// seen asks for a pass unless obj is the publisher's own last write.
func (p *Publisher) seen(obj any) {
	m, ok := obj.(metav1.Object)
	if !ok {
		p.poke()
		return
	}
	p.mu.Lock()
	w, ok := p.written[m.GetName()]
	p.mu.Unlock()
	if ok && w.uid == m.GetUID() && w.resourceVersion == m.GetResourceVersion() {
		return
	}
	p.poke()
}

// NeedLeaderElection: only the leader publishes.
func (p *Publisher) NeedLeaderElection() bool { return true }

// Reconcile lists every VPodTopology and hands their pools to the publisher.
func (p *Publisher) Reconcile(ctx context.Context, _ ctrl.Request) (ctrl.Result, error) {
	var list v1alpha1.VPodTopologyList
	// The cache's own objects, not copies: the pools only read them (a copy of 832 VPodTopologies per change
	// was the next largest allocation).
	if err := p.Client.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return ctrl.Result{}, fmt.Errorf("listing VPodTopologies: %w", err)
	}
	p.UpdateWithContext(ctx, list.Items)
	return ctrl.Result{}, nil
}

// Update replaces the published pools with those of domains.
func (p *Publisher) Update(domains []v1alpha1.VPodTopology) {
	p.UpdateWithContext(context.Background(), domains)
}

// UpdateWithContext is Update, logging a pool that cannot be published through ctx's logger (or Log) once.
// A pool whose VPodTopology facts are what they were keeps the spec built last time: every VPodTopology change
// rebuilds all pools, which at 832 vPODs of 16 devices allocated 1.2 GB over one start-up and set the peak RSS.
func (p *Publisher) UpdateWithContext(ctx context.Context, domains []v1alpha1.VPodTopology) {
	n := p.Devices
	if n <= 0 {
		n = DefaultDevices
	}
	p.mu.Lock()
	previousSpecs, previousFacts, previousRefused := p.desired, p.facts, p.refused
	p.mu.Unlock()
	desired := make(map[string]*resourceapi.ResourceSliceSpec, len(domains))
	facts := make(map[string]string, len(domains))
	refused := map[string]string{}
	for i := range domains {
		slice, f := SliceName(domains[i].Name), poolFacts(&domains[i], n)
		if spec, ok := previousSpecs[slice]; ok && previousFacts[slice] == f {
			desired[slice], facts[slice] = spec, f
			continue
		}
		specs, why := Specs(Resources(domains[i:i+1], n))
		for name, spec := range specs {
			desired[name], facts[name] = spec, f
		}
		maps.Copy(refused, why)
	}
	p.mu.Lock()
	p.desired, p.facts, p.refused = desired, facts, refused
	p.mu.Unlock()
	for pool, reason := range refused {
		if previousRefused[pool] != reason {
			p.logger(ctx).Error(errors.New(reason), "vPOD DRA pool not published", "pool", pool)
		}
	}
	p.poke()
}

// poolFacts is everything Resources reads of v, so that equal facts make an equal pool.
func poolFacts(v *v1alpha1.VPodTopology, devices int) string {
	return strings.Join(append([]string{strconv.Itoa(devices), v.Name, string(v.Spec.Kind), v.Spec.Domain,
		strconv.Itoa(int(v.Status.GPUs))}, Members(*v)...), "\x00")
}

// Specs turns pools into the spec of each pool's one slice, keyed by the slice's name (v1alpha1.VPodDRASliceName;
// generation left at 0), and names the pools that cannot be a slice with the reason: a VPodTopology name is up to
// 253 characters, and its slice's name five more.
func Specs(res *resourceslice.DriverResources) (specs map[string]*resourceapi.ResourceSliceSpec, refused map[string]string) {
	specs = make(map[string]*resourceapi.ResourceSliceSpec, len(res.Pools))
	refused = map[string]string{}
	for name, pool := range res.Pools {
		slice := v1alpha1.VPodDRASliceName(name)
		if errs := validation.IsDNS1123Subdomain(slice); len(errs) > 0 {
			refused[name] = "the pool's slice name (vpod-<VPodTopology name>) is no ResourceSlice name: " + strings.Join(errs, "; ")
			continue
		}
		spec := &resourceapi.ResourceSliceSpec{
			Driver:       DriverName,
			Pool:         resourceapi.ResourcePool{Name: name, ResourceSliceCount: 1},
			NodeSelector: pool.NodeSelector,
		}
		if len(pool.Slices) > 0 {
			spec.Devices = pool.Slices[0].Devices
		}
		specs[slice] = spec
	}
	return specs, refused
}

// sync makes the slices match the desired specs: it deletes every owned slice of no desired pool, then creates
// or rewrites each pool's slice. It goes on past a pool it cannot write and returns what failed.
func (p *Publisher) sync(ctx context.Context, store cache.Store) error {
	p.mu.Lock()
	desired := p.desired
	if p.written == nil {
		p.written = map[string]writtenSlice{}
	}
	p.mu.Unlock()
	if desired == nil {
		// No list of VPodTopologies yet: a restarted operator must not take its slices down meanwhile.
		return nil
	}
	var failed []error
	// Obsolete slices go first, so a pool is never published by two slices at once.
	for _, obj := range store.List() {
		m, ok := obj.(metav1.Object)
		if !ok {
			continue
		}
		if _, ok := desired[m.GetName()]; ok {
			continue
		}
		dctx, cancel := context.WithTimeout(ctx, p.writeLimit())
		err := p.Kube.ResourceV1().ResourceSlices().Delete(dctx, m.GetName(), metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: ptr.To(m.GetUID())}})
		cancel()
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			failed = append(failed, fmt.Errorf("deleting ResourceSlice %s of no vPOD: %w", m.GetName(), err))
		}
	}
	p.mu.Lock()
	for name := range p.written {
		if _, ok := desired[name]; !ok {
			delete(p.written, name)
		}
	}
	p.mu.Unlock()
	names := make([]string, 0, len(desired))
	for name := range desired {
		names = append(names, name)
	}
	sort.Strings(names)
	var writers errgroup.Group
	writers.SetLimit(parallelWrites)
	var failedMu sync.Mutex
	for _, name := range names {
		writers.Go(func() error {
			if ctx.Err() != nil {
				return nil
			}
			if err := p.syncPool(ctx, store, name, desired[name]); err != nil {
				failedMu.Lock()
				failed = append(failed, fmt.Errorf("pool %s: %w", name, err))
				failedMu.Unlock()
			}
			return nil
		})
	}
	_ = writers.Wait() // the writers report into failed
	if ctx.Err() != nil {
		return fmt.Errorf("publishing vPOD ResourceSlices: %w", ctx.Err())
	}
	return joinFirst(failed, 5)
}

// joinFirst joins the first n errors and counts the rest, so a pass over a thousand pools logs one short line.
func joinFirst(errs []error, n int) error {
	if len(errs) <= n {
		return errors.Join(errs...)
	}
	return fmt.Errorf("%w (and %d more failures)", errors.Join(errs[:n]...), len(errs)-n)
}

// defaultWriteLimit is Publisher.WriteLimit when unset.
const defaultWriteLimit = 30 * time.Second

func (p *Publisher) writeLimit() time.Duration {
	if p.WriteLimit > 0 {
		return p.WriteLimit
	}
	return defaultWriteLimit
}

// syncPool makes the pool's slice (name) match spec, within the write limit.
func (p *Publisher) syncPool(ctx context.Context, store cache.Store, name string, spec *resourceapi.ResourceSliceSpec) error {
	ctx, cancel := context.WithTimeout(ctx, p.writeLimit())
	defer cancel()
	p.mu.Lock()
	w, known := p.written[name]
	p.mu.Unlock()
	if known && confirmed(store, name, w) {
		if w.spec == spec || apiequality.Semantic.DeepEqual(w.spec, spec) {
			p.remember(name, w.uid, w.resourceVersion, w.generation, spec) // let go of the older, equal spec
			return nil
		}
		return p.write(ctx, &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: w.resourceVersion}}, w.generation, spec)
	}
	slices := p.Kube.ResourceV1().ResourceSlices()
	if _, watched, _ := store.GetByKey(name); !known && !watched {
		// Most likely a new vPOD: one create, and a read only when the name turns out taken.
		err := p.write(ctx, nil, 1, spec)
		if !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	// Not known to be the publisher's own last write: read what is there.
	cur, err := slices.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return p.write(ctx, nil, 1, spec)
	case err != nil:
		return fmt.Errorf("reading ResourceSlice %s: %w", name, err)
	}
	if cur.Spec.Driver != DriverName {
		return fmt.Errorf("ResourceSlice %s belongs to driver %q: not replaced", name, cur.Spec.Driver)
	}
	if cur.Spec.NodeName != nil || ptr.Deref(cur.Spec.AllNodes, false) || cur.Spec.Pool.Name != spec.Pool.Name {
		// Who is bound to one node (or all) stays so, and a slice's pool stays its pool (the vPOD pools were
		// named vpod-<x> before): the API server refuses to change either, so the slice is replaced.
		err := slices.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: ptr.To(cur.UID)}})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting ResourceSlice %s of pool %.80q, bound to other nodes than its vPOD's or to another pool: %w", name, cur.Spec.Pool.Name, err)
		}
		generation := int64(1)
		if cur.Spec.Pool.Name == spec.Pool.Name {
			generation = max(cur.Spec.Pool.Generation+1, 1)
		}
		return p.write(ctx, nil, generation, spec)
	}
	generation := max(cur.Spec.Pool.Generation, 1)
	if sameSlice(cur, spec) {
		p.remember(name, cur.UID, cur.ResourceVersion, cur.Spec.Pool.Generation, spec)
		return nil
	}
	return p.write(ctx, &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: cur.ResourceVersion}}, generation, spec)
}

// confirmed: the watch shows the slice as the publisher last wrote it.
func confirmed(store cache.Store, name string, w writtenSlice) bool {
	obj, ok, err := store.GetByKey(name)
	if err != nil || !ok {
		return false
	}
	m, ok := obj.(metav1.Object)
	return ok && m.GetUID() == w.uid && m.GetResourceVersion() == w.resourceVersion
}

// sameSlice: cur is spec at some generation, with no labels, annotations or owners added.
func sameSlice(cur *resourceapi.ResourceSlice, spec *resourceapi.ResourceSliceSpec) bool {
	if len(cur.Labels) > 0 || len(cur.Annotations) > 0 || len(cur.OwnerReferences) > 0 || len(cur.Finalizers) > 0 {
		return false
	}
	got := cur.Spec
	got.Pool.Generation = 0
	return apiequality.Semantic.DeepEqual(&got, spec)
}

// write creates the slice (onto nil) or replaces onto's object (name and resourceVersion set) with spec at
// generation, and remembers the result.
func (p *Publisher) write(ctx context.Context, onto *resourceapi.ResourceSlice, generation int64, spec *resourceapi.ResourceSliceSpec) error {
	slice := &resourceapi.ResourceSlice{Spec: *spec}
	slice.Spec.Pool.Generation = generation
	slices := p.Kube.ResourceV1().ResourceSlices()
	var got *resourceapi.ResourceSlice
	var err error
	if onto == nil {
		slice.Name = v1alpha1.VPodDRASliceName(spec.Pool.Name)
		got, err = slices.Create(ctx, slice, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("creating ResourceSlice %s: %w", slice.Name, err)
		}
	} else {
		slice.ObjectMeta = onto.ObjectMeta
		got, err = slices.Update(ctx, slice, metav1.UpdateOptions{})
		if err != nil {
			return fmt.Errorf("updating ResourceSlice %s: %w", slice.Name, err)
		}
	}
	p.remember(got.Name, got.UID, got.ResourceVersion, got.Spec.Pool.Generation, spec)
	return nil
}

func (p *Publisher) remember(name string, uid types.UID, resourceVersion string, generation int64, spec *resourceapi.ResourceSliceSpec) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.written[name] = writtenSlice{uid: uid, resourceVersion: resourceVersion, generation: generation, spec: spec}
}

// allPoolsKey names the one request every VPodTopology change enqueues: Reconcile rebuilds all pools from the
// list, so a burst of changes (a thousand nodes' vPODs written at start) is one pass, not one pass per object.
const allPoolsKey = "vpod-dra-pools"

// rebuildWindow is how long a change waits for the next ones: the request, once waiting, keeps its time, so
// changes arriving all the time rebuild the pools once a second, not once per change (a list of 832
// VPodTopologies and their facts is about 1 MB of allocation).
const rebuildWindow = time.Second

// SetupWithManager runs the publisher in mgr and reconciles it after VPodTopology changes.
func (p *Publisher) SetupWithManager(mgr ctrl.Manager) error {
	if err := mgr.Add(p); err != nil {
		return fmt.Errorf("adding the vPOD ResourceSlice publisher: %w", err)
	}
	all := reconcile.Request{NamespacedName: types.NamespacedName{Name: allPoolsKey}}
	enqueue := func(q workqueue.TypedRateLimitingInterface[reconcile.Request]) { q.AddAfter(all, rebuildWindow) }
	if err := ctrl.NewControllerManagedBy(mgr).Named("vpod-dra").
		Watches(&v1alpha1.VPodTopology{}, handler.Funcs{
			CreateFunc: func(_ context.Context, _ event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				enqueue(q)
			},
			UpdateFunc: func(_ context.Context, _ event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				enqueue(q)
			},
			DeleteFunc: func(_ context.Context, _ event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				enqueue(q)
			},
			GenericFunc: func(_ context.Context, _ event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				enqueue(q)
			},
		}).Complete(p); err != nil {
		return fmt.Errorf("watching VPodTopologies for the vPOD ResourceSlice publisher: %w", err)
	}
	return nil
}
