// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Command nodecert issues one node's agent certificate from a pool's CA, for agents the demo runs as local
// processes: they use the admin's credentials, which no pod binds to a node, so the operator would rightly
// deny their certificate requests. In a cluster the operator signs each agent's own request instead.
//
//	nodecert -ca DIR -pool-namespace default -pool kv-cache -node gpu-node-a -out DIR
//
// -ca holds the CA Secret's tls.crt, ca.key and ca.crt; -out receives tls.crt, tls.key and ca.crt.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fabricxfer/fabricxfer/agent/peers"
	"github.com/fabricxfer/fabricxfer/internal/pki"
)

func main() {
	caDir := flag.String("ca", "", "directory with the pool CA's tls.crt, ca.key and ca.crt")
	ns := flag.String("pool-namespace", "default", "namespace of the pool")
	pool := flag.String("pool", "", "name of the pool")
	node := flag.String("node", "", "node the certificate names")
	out := flag.String("out", "", "directory to write tls.crt, tls.key and ca.crt into")
	validity := flag.Duration("validity", 24*time.Hour, "life of the certificate")
	flag.Parse()
	if err := run(*caDir, *ns, *pool, *node, *out, *validity); err != nil {
		fmt.Fprintln(os.Stderr, "nodecert:", err)
		os.Exit(1)
	}
}

func run(caDir, ns, pool, node, out string, validity time.Duration) error {
	if caDir == "" || pool == "" || node == "" || out == "" {
		return fmt.Errorf("-ca, -pool, -node and -out are required")
	}
	read := func(name string) ([]byte, error) {
		b, err := os.ReadFile(filepath.Join(caDir, name))
		if err != nil {
			return nil, fmt.Errorf("reading the pool CA: %w", err)
		}
		return b, nil
	}
	cert, err := read(pki.CertKey)
	if err != nil {
		return err
	}
	key, err := read(pki.CAKeyKey)
	if err != nil {
		return err
	}
	bundle, err := read(pki.BundleKey)
	if err != nil {
		return err
	}
	leaf, err := pki.IssueNode(pki.KeyPair{CertPEM: cert, KeyPEM: key}, ns, pool, node, time.Now(), validity)
	if err != nil {
		return err
	}
	if err := peers.WriteFiles(out, leaf, bundle); err != nil {
		return fmt.Errorf("writing the certificate of node %s: %w", node, err)
	}
	return nil
}
