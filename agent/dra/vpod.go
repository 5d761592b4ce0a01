// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package dra

import (
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

// vpodPools reads the operator's vPOD slices (controllers/vpoddra) for one Prepare call, each pool once.
//
// A vPOD pool is named after its VPodTopology object, and a declared one may have any name, so the name says
// nothing about the domain. The slice does: the operator names it after the pool and gives its devices the
// VPodTopology's spec.domain as attribute vpod. Only the operator writes slices of this driver bound to no node
// (the agents' admission policy holds them to their own node's), and the node compares that domain with what
// its own detection reports, so a claim still cannot make a node prepare a vPOD it is not in.
type vpodPools struct {
	kube   kubernetes.Interface
	slices map[string]*resourceapi.ResourceSlice
	errs   map[string]error
}

func newVPodPools(kube kubernetes.Interface) *vpodPools {
	return &vpodPools{kube: kube, slices: map[string]*resourceapi.ResourceSlice{}, errs: map[string]error{}}
}

// domain is the fabric domain key of device in vPOD pool, as the pool's slice publishes it.
func (v *vpodPools) domain(ctx context.Context, pool, device string) (string, error) {
	slice, err := v.slice(ctx, pool)
	if err != nil {
		return "", err
	}
	for _, d := range slice.Spec.Devices {
		if d.Name != device {
			continue
		}
		if typ := d.Attributes[AttrType].StringValue; typ == nil || *typ != "vpod" {
			return "", fmt.Errorf("device %s of pool %s is not a vPOD device", device, pool)
		}
		domain := ptr.Deref(d.Attributes[AttrVPod].StringValue, "")
		if domain == "" {
			// The publisher leaves it empty for a key longer than an attribute holds (64 characters).
			return "", fmt.Errorf("vPOD pool %s publishes no domain key", pool)
		}
		return domain, nil
	}
	return "", fmt.Errorf("vPOD pool %s has no device %s", pool, device)
}

// slice reads the operator's slice of pool (v1alpha1.VPodDRASliceName).
func (v *vpodPools) slice(ctx context.Context, pool string) (*resourceapi.ResourceSlice, error) {
	if s, ok := v.slices[pool]; ok {
		return s, nil
	}
	if err, ok := v.errs[pool]; ok {
		return nil, err
	}
	s, err := v.read(ctx, pool)
	if err != nil {
		v.errs[pool] = err
		return nil, err
	}
	v.slices[pool] = s
	return s, nil
}

func (v *vpodPools) read(ctx context.Context, pool string) (*resourceapi.ResourceSlice, error) {
	ctx, cancel := context.WithTimeout(ctx, apiReadLimit)
	defer cancel()
	s, err := v.kube.ResourceV1().ResourceSlices().Get(ctx, v1alpha1.VPodDRASliceName(pool), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("no vPOD pool %s is published", pool)
	}
	if err != nil {
		return nil, fmt.Errorf("reading the ResourceSlice of vPOD pool %s: %w", pool, err)
	}
	// The slice may still carry the pool's name from before the rename (vpod-<x>, its own object name) until the
	// operator replaces it, or after going back to an older operator.
	switch {
	case s.Spec.Driver != DriverName || s.Spec.Pool.Name != pool && s.Spec.Pool.Name != v1alpha1.VPodDRASliceName(pool):
		return nil, fmt.Errorf("ResourceSlice %s is pool %s of driver %s, not vPOD pool %s", s.Name, s.Spec.Pool.Name, s.Spec.Driver, pool)
	case ptr.Deref(s.Spec.NodeName, "") != "" || ptr.Deref(s.Spec.AllNodes, false):
		return nil, fmt.Errorf("ResourceSlice %s is bound to a node or to all nodes: not the operator's vPOD slice", s.Name)
	}
	return s, nil
}
