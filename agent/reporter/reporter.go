package reporter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/go-logr/logr"

	"github.com/fabricxfer/fabricxfer/agent/report"
	v1alpha1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/topology"
)

// FieldManager is the server-side apply field manager of every write the agent makes.
const FieldManager = "fabricxfer-agent"

// Config says what to report, where, and how often.
type Config struct {
	NodeName      string
	PoolNamespace string
	PoolName      string
	// Period is both the heartbeat and the re-detection interval.
	Period   time.Duration
	Identity report.Identity
	// Detect reads the node; it is called once per period.
	Detect func(ctx context.Context) (topology.Report, error)
	Client client.Client
	Log    logr.Logger
	// Now returns the heartbeat time; time.Now when nil.
	Now func() time.Time
	// Decorate, when set, adds what other parts of the agent know (registered bytes) to each status before
	// it is applied. Every status field goes through this one apply: a second apply by the same field
	// manager that left out the detected fields would remove them.
	Decorate func(*v1alpha1.TransferNodeStatus)
}

// Reporter writes one node's TransferNode.
type Reporter struct {
	cfg Config
	// objectApplied is true once metadata and spec were applied; they are applied again only after an
	// error, so thousands of agents do not rewrite unchanged specs every period.
	objectApplied bool
}

// New checks the configuration.
func New(cfg Config) (*Reporter, error) {
	switch {
	case cfg.NodeName == "":
		return nil, errors.New("reporter: node name is empty (set --node-name or NODE_NAME)")
	case cfg.Period <= 0:
		return nil, fmt.Errorf("reporter: period %s must be positive", cfg.Period)
	case cfg.Detect == nil:
		return nil, errors.New("reporter: no detector")
	case cfg.Client == nil:
		return nil, errors.New("reporter: no Kubernetes client")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Reporter{cfg: cfg}, nil
}

// Run reports at once and then every period until ctx ends. Failed rounds are logged and retried next
// period; Run returns nil when ctx is cancelled.
func (r *Reporter) Run(ctx context.Context) error {
	t := time.NewTicker(r.cfg.Period)
	defer t.Stop()
	for {
		if err := r.ReportOnce(ctx); err != nil && ctx.Err() == nil {
			r.cfg.Log.Error(err, "reporting node", "node", r.cfg.NodeName)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// ReportOnce detects the node and applies the TransferNode and its status. Each step is bounded by the
// period, so a slow API server cannot stack up rounds.
func (r *Reporter) ReportOnce(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Period)
	defer cancel()
	rep, err := r.cfg.Detect(ctx)
	if err != nil {
		return fmt.Errorf("detecting node %s: %w", r.cfg.NodeName, err)
	}
	if !r.objectApplied {
		if err := r.applyObject(ctx); err != nil {
			return err
		}
		r.objectApplied = true
	}
	st := report.Status(rep, r.cfg.Identity)
	beat := metav1.NewTime(r.cfg.Now())
	st.LastHeartbeat = &beat
	if r.cfg.Decorate != nil {
		r.cfg.Decorate(&st)
	}
	if err := r.applyStatus(ctx, st); err != nil {
		// Only a missing object (deleted with a recreated Node) needs the object written again; re-applying it
		// after every failure tripled the requests of a struggling API server.
		if apierrors.IsNotFound(err) {
			r.objectApplied = false
		}
		return err
	}
	return nil
}

func (r *Reporter) applyObject(ctx context.Context) error {
	var node corev1.Node
	if err := r.cfg.Client.Get(ctx, client.ObjectKey{Name: r.cfg.NodeName}, &node); err != nil {
		return fmt.Errorf("reading Node %s to own its TransferNode: %w", r.cfg.NodeName, err)
	}
	labels := map[string]any{}
	if r.cfg.PoolName != "" {
		labels[v1alpha1.LabelPoolName] = r.cfg.PoolName
	}
	if r.cfg.PoolNamespace != "" {
		labels[v1alpha1.LabelPoolNamespace] = r.cfg.PoolNamespace
	}
	spec := map[string]any{"nodeName": r.cfg.NodeName}
	if r.cfg.PoolNamespace != "" {
		spec["poolNamespace"] = r.cfg.PoolNamespace
	}
	if r.cfg.PoolName != "" {
		spec["poolName"] = r.cfg.PoolName
	}
	meta := map[string]any{
		"name": r.cfg.NodeName,
		"ownerReferences": []any{map[string]any{
			"apiVersion": "v1",
			"kind":       "Node",
			"name":       node.Name,
			"uid":        string(node.UID),
		}},
	}
	if len(labels) > 0 {
		meta["labels"] = labels
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(),
		"kind":       "TransferNode",
		"metadata":   meta,
		"spec":       spec,
	}}
	if err := r.cfg.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(obj), client.FieldOwner(FieldManager), client.ForceOwnership); err != nil {
		return fmt.Errorf("applying TransferNode %s: %w", r.cfg.NodeName, err)
	}
	return nil
}

func (r *Reporter) applyStatus(ctx context.Context, st v1alpha1.TransferNodeStatus) error {
	raw, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("encoding TransferNode status: %w", err)
	}
	var status map[string]any
	if err := json.Unmarshal(raw, &status); err != nil {
		return fmt.Errorf("encoding TransferNode status: %w", err)
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(),
		"kind":       "TransferNode",
		"metadata":   map[string]any{"name": r.cfg.NodeName},
		"status":     status,
	}}
	if err := r.cfg.Client.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(obj), client.FieldOwner(FieldManager), client.ForceOwnership); err != nil {
		return fmt.Errorf("applying TransferNode %s status: %w", r.cfg.NodeName, err)
	}
	return nil
}
