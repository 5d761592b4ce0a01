// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"
)

// domainKeyPattern is the form of a domain key the CRDs take (TransferNode GPUs, VPodTopology spec.domain).
var domainKeyPattern = regexp.MustCompile(`^(ualink:[0-9a-fA-F-]+/[0-9]+|nvlink:[0-9a-fA-F-]+\.[0-9]+)$`)

// MaxDomainKey is the longest domain key the CRDs take.
const MaxDomainKey = 128

// MaxGPUIndex is the largest GPU index a VPodTopology member may name.
const MaxGPUIndex = 1023

// MaxVPodMembers is the most members (and missing members) a VPodTopology's status lists.
const MaxVPodMembers = 1024

// ValidDomainKey reports whether key has the form and length the CRDs take for a domain key.
func ValidDomainKey(key string) bool {
	return len(key) <= MaxDomainKey && domainKeyPattern.MatchString(key)
}

// DomainObjectName derives a VPodTopology name from a domain key. Keys hold ':', '/' and '.', which names may
// not, so the readable part is sanitised and a short hash of the whole key keeps distinct keys distinct.
func DomainObjectName(key string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(key) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	readable := strings.Trim(b.String(), "-")
	if len(readable) > 50 {
		readable = strings.Trim(readable[:50], "-")
	}
	sum := sha256.Sum256([]byte(key))
	return fmt.Sprintf("%s-%s", readable, hex.EncodeToString(sum[:])[:8])
}

// DomainKind returns the fabric kind a domain key names, or an error for a key of no known kind.
func DomainKind(key string) (FabricKind, error) {
	kind, _, ok := strings.Cut(key, ":")
	switch FabricKind(kind) {
	case FabricUALink, FabricNVLink:
		if ok {
			return FabricKind(kind), nil
		}
	}
	return "", fmt.Errorf("domain key %q: want ualink:<ppod>/<vpod> or nvlink:<clusterUUID>.<cliqueId>", key)
}

// MemberLabel is the label key (value "true") that marks a declared VPodTopology naming node as a member. Node
// names may be 253 characters and a label name 63, so the key holds a hash of the name: the agent of node
// selects with it, and still checks spec.members, since anyone who writes VPodTopologies can set labels.
func MemberLabel(node string) string {
	sum := sha256.Sum256([]byte(node))
	return MemberLabelPrefix + hex.EncodeToString(sum[:])[:20]
}
