// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package node

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fabricxfer/fabricxfer/agent/peers"
	"github.com/fabricxfer/fabricxfer/internal/pki"
)

// WritePoolCertificates writes a pool's agent certificates (tls.crt, tls.key, ca.crt, as the operator's Secret
// mounts them) into dir with the operator's own PKI, for agents run without Kubernetes: every agent of the pool
// is given the same directory (Config.TLSDir). The CA's key is not kept: nothing can issue more certificates
// for this pool later. A directory that already holds any of the files is left as it is.
func WritePoolCertificates(dir, namespace, name string, validity time.Duration) error {
	for _, f := range []string{pki.CertKey, pki.KeyKey, pki.BundleKey} {
		if _, err := os.Lstat(filepath.Join(dir, f)); err == nil {
			return fmt.Errorf("%s already holds %s: refusing to replace a pool's certificates", dir, f)
		}
	}
	now := time.Now()
	ca, err := pki.NewCA(namespace, name, now, validity)
	if err != nil {
		return fmt.Errorf("creating the pool's CA: %w", err)
	}
	agent, err := pki.IssueAgent(ca, namespace, name, now, validity)
	if err != nil {
		return fmt.Errorf("issuing the agent certificate: %w", err)
	}
	if err := peers.WriteFiles(dir, agent, ca.CertPEM); err != nil {
		return fmt.Errorf("writing the certificates into %s: %w", dir, err)
	}
	return nil
}
