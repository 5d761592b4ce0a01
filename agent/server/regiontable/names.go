// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package regiontable

import (
	"fmt"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Published names (Region segments and layouts) live in the namespace of the caller that published them, so
// a pod of another namespace can neither read nor squat them. A reference is "name" (the asker's namespace)
// or "namespace/name"; an owner reaches its own names either way, others only when the owner granted their
// namespace ("*": every namespace the pool admits). An ungranted name looks exactly like a missing one.

// publication is who published a name and who else may use it.
type publication struct {
	namespace string
	grants    []string
}

// scopedName is the key of name in namespace (names hold no '/': CheckSegmentName refuses it).
func scopedName(namespace, name string) string { return namespace + "/" + name }

// resolveName turns a reference made by a caller of namespace asker into the key it names.
func resolveName(asker, ref string) string {
	if strings.Contains(ref, "/") {
		return ref
	}
	return scopedName(asker, ref)
}

// admits reports whether a caller of namespace asker may use the published name.
func (p publication) admits(asker string) bool {
	return asker == p.namespace || slices.Contains(p.grants, asker) || slices.Contains(p.grants, "*")
}

// CheckGrants validates the namespaces a publication grants.
func CheckGrants(grants []string) error {
	if len(grants) > 64 {
		return status.Errorf(codes.InvalidArgument, "at most 64 granted namespaces, got %d", len(grants))
	}
	for _, g := range grants {
		if g == "*" {
			continue
		}
		if !isNamespaceName(g) {
			return status.Errorf(codes.InvalidArgument, "granted namespace %q is not a namespace name (or \"*\")", g)
		}
	}
	return nil
}

// isNamespaceName reports whether s is spelled as a Kubernetes namespace can be (lower-case letters, digits and
// '-', at most 63).
func isNamespaceName(s string) bool {
	return s != "" && len(s) <= 63 && !strings.ContainsFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-')
	})
}

// checkLookup validates what another agent asks for: a segment reference and the namespace of the pod that asks
// ("" for a local process of an agent that admits them). A peer's strings are kept (a layout's askers, told when
// it goes) and quoted in answers, so they must be names, not megabytes.
func checkLookup(segment, asker string) error {
	if asker != "" && !isNamespaceName(asker) {
		return status.Errorf(codes.InvalidArgument, "the asking namespace (%d bytes) is not a namespace name", len(asker))
	}
	return CheckSegmentRef(segment)
}

// CheckSegmentRef validates a reference to a published name: "name" or "namespace/name".
func CheckSegmentRef(ref string) error {
	if len(ref) > 64+MaxSegmentName {
		return status.Errorf(codes.InvalidArgument, "segment reference is %d bytes, at most %d", len(ref), 64+MaxSegmentName)
	}
	ns, name, scoped := strings.Cut(ref, "/")
	if !scoped {
		name = ref
	} else if len(ns) > 63 || strings.Contains(name, "/") {
		return status.Errorf(codes.InvalidArgument, "segment %q: name it \"name\" or \"namespace/name\"", ref)
	}
	if name == "" {
		return status.Errorf(codes.InvalidArgument, "segment name %q is not valid", ref)
	}
	return CheckSegmentName(name)
}

// notFoundHintLocked is what a caller of namespace asker who found no region segment (layout false) or no layout
// segment (layout true) of that name is told the name is instead: the other kind, when it has one the caller may
// use (a caller is never told of names it may not use). Empty when there is none.
func (tab *Table) notFoundHintLocked(name, asker string, layout bool) string {
	key := resolveName(asker, name)
	if layout {
		if r, ok := tab.segments[key]; ok && r.desc != nil && r.pub.admits(asker) {
			return fmt.Sprintf(": %q is a region's segment, which items move to (to_segment, client.ToSegment), not blocks", name)
		}
		return ""
	}
	if l, ok := tab.layoutSegments[key]; ok && l.pub.admits(asker) {
		return fmt.Sprintf(": %q is a layout's segment, whose blocks move with transfer_blocks (to_layout_segment, client.ToLayoutSegment; resolve_layout, client.ResolveLayoutSegment, says its geometry)", name)
	}
	return ""
}
