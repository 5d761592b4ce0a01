// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

// DomainObservation is one scale-up domain as the TransferNodes report it.
type DomainObservation struct {
	Key  string
	Kind fxv1.FabricKind
	// Members are nodes with a fresh heartbeat that report GPUs in the domain, sorted by node.
	Members []fxv1.VPodMember
	// Stale are nodes that still report the domain but whose heartbeat expired, sorted.
	Stale []string
	// Size is the largest domain size (GPUs) a fresh member reports for the domain; 0 when none says.
	Size int32
	// Truncated counts fresh members left out of Members past MaxVPodMembers.
	Truncated int
}

// AggregateDomains groups the GPUs of every TransferNode by fabric domain key. fresh says whether a report's
// agent heartbeat is fresh (its timeout depends on the pool of the agent that wrote it).
func AggregateDomains(tns []fxv1.TransferNode, fresh func(*fxv1.TransferNode) bool) map[string]*DomainObservation {
	domains := map[string]*DomainObservation{}
	for i := range tns {
		tn := &tns[i]
		fresh := fresh(tn)
		perDomain := map[string][]int32{}
		sizes := map[string]int32{}
		for _, g := range tn.Status.GPUs {
			// What the CRD bounds is bounded here again: a report stored before those bounds, or one that got
			// past them, must not put into a domain's status what its schema refuses, which would refuse every
			// status write of that domain.
			if g.Fabric == nil || !fxv1.ValidDomainKey(g.Fabric.Domain) || g.Index < 0 || g.Index > fxv1.MaxGPUIndex {
				continue
			}
			perDomain[g.Fabric.Domain] = append(perDomain[g.Fabric.Domain], g.Index)
			sizes[g.Fabric.Domain] = max(sizes[g.Fabric.Domain], g.Fabric.DomainSize)
		}
		for key, gpus := range perDomain {
			kind, err := fxv1.DomainKind(key)
			if err != nil {
				continue // an agent of another version; nothing sensible to aggregate
			}
			d := domains[key]
			if d == nil {
				d = &DomainObservation{Key: key, Kind: kind}
				domains[key] = d
			}
			if fresh {
				slices.Sort(gpus)
				gpus = slices.Compact(gpus)
				d.Members = append(d.Members, fxv1.VPodMember{Node: tn.Name, GPUs: gpus})
				d.Size = max(d.Size, sizes[key])
			} else {
				d.Stale = append(d.Stale, tn.Name)
			}
		}
	}
	for _, d := range domains {
		slices.SortFunc(d.Members, func(a, b fxv1.VPodMember) int { return strings.Compare(a.Node, b.Node) })
		slices.Sort(d.Stale)
		// A status lists at most MaxVPodMembers nodes; more reporting one domain are counted as missing
		// nothing and listed no further (the first by name stay), rather than refuse the whole write.
		d.Truncated = max(len(d.Members)-fxv1.MaxVPodMembers, 0)
		d.Members = d.Members[:min(len(d.Members), fxv1.MaxVPodMembers)]
		d.Stale = d.Stale[:min(len(d.Stale), fxv1.MaxVPodMembers)]
	}
	return domains
}

// ComputeVPodStatus derives a VPodTopology's status from its declaration and the observed domain (nil when no
// node reports it).
func ComputeVPodStatus(vp *fxv1.VPodTopology, obs *DomainObservation) fxv1.VPodTopologyStatus {
	status := fxv1.VPodTopologyStatus{
		ObservedGeneration: vp.Generation,
		Conditions:         slices.Clone(vp.Status.Conditions),
	}
	reporting := map[string]bool{}
	missing := map[string]bool{}
	if obs != nil {
		status.Members = obs.Members
		for _, m := range obs.Members {
			reporting[m.Node] = true
			status.GPUs += int32(len(m.GPUs))
		}
		// A member whose agent went quiet is missing until it returns or its Node goes away.
		for _, n := range obs.Stale {
			missing[n] = true
		}
	}
	status.Nodes = int32(len(status.Members))
	declared := map[string]bool{}
	for _, m := range vp.Spec.Members {
		declared[m.Node] = true
		if !reporting[m.Node] {
			missing[m.Node] = true
		}
	}
	if len(declared) > 0 {
		for _, m := range status.Members {
			if !declared[m.Node] {
				status.UndeclaredMembers = append(status.UndeclaredMembers, m.Node)
			}
		}
	}
	for n := range missing {
		status.MissingMembers = append(status.MissingMembers, n)
	}
	slices.Sort(status.MissingMembers)
	status.MissingMembers = status.MissingMembers[:min(len(status.MissingMembers), fxv1.MaxVPodMembers)]

	set := func(condType string, s metav1.ConditionStatus, reason, msg string) {
		meta.SetStatusCondition(&status.Conditions, metav1.Condition{
			Type: condType, Status: s, Reason: reason, Message: boundedMessage(msg), ObservedGeneration: vp.Generation,
		})
	}
	switch {
	case status.Nodes == 0:
		msg := "no node with a fresh heartbeat reports this domain"
		set(fxv1.ConditionReady, metav1.ConditionFalse, fxv1.ReasonNoMembers, msg)
		set(fxv1.ConditionDegraded, metav1.ConditionTrue, fxv1.ReasonNoMembers, msg)
	case len(status.MissingMembers) > 0:
		msg := "members not reporting: " + strings.Join(status.MissingMembers, ", ")
		set(fxv1.ConditionReady, metav1.ConditionFalse, fxv1.ReasonMembersMissing, msg)
		set(fxv1.ConditionDegraded, metav1.ConditionTrue, fxv1.ReasonMembersMissing, msg)
	default:
		msg := "every member reports the domain"
		if obs != nil && obs.Truncated > 0 {
			msg += fmt.Sprintf("; %d more nodes report it than a status lists (%d)", obs.Truncated, fxv1.MaxVPodMembers)
		}
		set(fxv1.ConditionReady, metav1.ConditionTrue, fxv1.ReasonMembersComplete, msg)
		set(fxv1.ConditionDegraded, metav1.ConditionFalse, fxv1.ReasonMembersComplete, msg)
	}
	return status
}

// DomainOwners picks, per domain key, the VPodTopology that describes it when several do: a declared one
// before a discovered one (an admin's declaration pins membership), then the oldest, then the first by name.
// CEL cannot see other objects, so the API server accepts a second declaration of a domain; this says which
// one counts.
func DomainOwners(vps []fxv1.VPodTopology) map[string]*fxv1.VPodTopology {
	owners := map[string]*fxv1.VPodTopology{}
	for i := range vps {
		vp := &vps[i]
		cur, ok := owners[vp.Spec.Domain]
		if !ok || describesFirst(vp, cur) {
			owners[vp.Spec.Domain] = vp
		}
	}
	return owners
}

func describesFirst(a, b *fxv1.VPodTopology) bool {
	aDeclared, bDeclared := a.Labels[fxv1.LabelDiscovered] != "true", b.Labels[fxv1.LabelDiscovered] != "true"
	if aDeclared != bDeclared {
		return aDeclared
	}
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	return a.Name < b.Name
}

// DuplicateVPodStatus is the status of a declaration whose domain another VPodTopology (owner) describes: no
// members, Ready=False with reason DuplicateDomain naming the owner.
func DuplicateVPodStatus(vp, owner *fxv1.VPodTopology) fxv1.VPodTopologyStatus {
	status := fxv1.VPodTopologyStatus{ObservedGeneration: vp.Generation, Conditions: slices.Clone(vp.Status.Conditions)}
	msg := fmt.Sprintf("domain %s is already described by VPodTopology %s; this one is ignored, delete it", vp.Spec.Domain, owner.Name)
	for _, c := range []struct {
		condType string
		s        metav1.ConditionStatus
	}{{fxv1.ConditionReady, metav1.ConditionFalse}, {fxv1.ConditionDegraded, metav1.ConditionTrue}} {
		meta.SetStatusCondition(&status.Conditions, metav1.Condition{Type: c.condType, Status: c.s,
			Reason: fxv1.ReasonDuplicateDomain, Message: boundedMessage(msg), ObservedGeneration: vp.Generation})
	}
	return status
}

// maxNamedNodes bounds the nodes a condition message names, as Events do.
const maxNamedNodes = 16

// DeclaredCondition says whether the agents of a declared VPodTopology's members took every declared GPU into
// the domain, from what each member's report says of the declaration (reports by node). A member whose agent
// refused GPUs (the hardware reports another domain, another declaration holds them, the pool pins every GPU
// with fabricDomainOverride, the node lacks them) makes it False with reason DeclarationConflict naming the
// member and why; one whose report does not mention the declaration yet, or that has no report at all (named
// apart: a misspelled node), makes it False with DeclarationPending. reports are those that mention the domain;
// hasReport says whether a node has a report at all.
func DeclaredCondition(vp *fxv1.VPodTopology, reports map[string]*fxv1.TransferNode, hasReport func(node string) bool) metav1.Condition {
	var conflicts, pending, unknown []string
	for _, m := range vp.Spec.Members {
		tn := reports[m.Node]
		if tn == nil {
			// reports hold those that mention the domain; another report of the node has not taken it yet.
			if hasReport != nil && hasReport(m.Node) {
				pending = append(pending, m.Node)
			} else {
				unknown = append(unknown, m.Node)
			}
			continue
		}
		var found *fxv1.FabricDeclaration
		for i := range tn.Status.Declarations {
			if d := &tn.Status.Declarations[i]; d.VPodTopology == vp.Name && d.Domain == vp.Spec.Domain {
				found = d
			}
		}
		switch {
		case found == nil:
			pending = append(pending, m.Node)
		case found.Refused != "":
			conflicts = append(conflicts, m.Node+": "+found.Refused)
		}
	}
	c := metav1.Condition{Type: fxv1.ConditionDeclared, ObservedGeneration: vp.Generation}
	switch {
	case len(conflicts) > 0:
		c.Status, c.Reason = metav1.ConditionFalse, fxv1.ReasonDeclarationConflict
		c.Message = "declared GPUs not in the domain (nothing is routed by this declaration there): " + namedAtMost(conflicts, "; ")
	case len(pending) > 0 || len(unknown) > 0:
		c.Status, c.Reason = metav1.ConditionFalse, fxv1.ReasonDeclarationPending
		var parts []string
		if len(pending) > 0 {
			parts = append(parts, "members whose agents have not reported this declaration yet: "+namedAtMost(pending, ", "))
		}
		if len(unknown) > 0 {
			// No agent reports for such a node at all: a misspelled name waits for ever, and should say so.
			parts = append(parts, "members no agent reports for (no TransferNode: is the node name right?): "+namedAtMost(unknown, ", "))
		}
		c.Message = strings.Join(parts, "; ")
	default:
		c.Status, c.Reason = metav1.ConditionTrue, fxv1.ReasonDeclarationTaken
		c.Message = "every member's agent put the declared GPUs in the domain"
	}
	return c
}

func namedAtMost(items []string, sep string) string {
	if len(items) <= maxNamedNodes {
		return strings.Join(items, sep)
	}
	return strings.Join(items[:maxNamedNodes], sep) + fmt.Sprintf("%s%d more", sep, len(items)-maxNamedNodes)
}
