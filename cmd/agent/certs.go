// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/fabricxfer/fabricxfer/agent/node"
)

// maxCertValidity bounds --validity: these certificates are for machines run by hand, not a cluster's rotation.
const maxCertValidity = 366 * 24 * time.Hour

// certsCommand writes a pool's agent certificates for agents run without Kubernetes (node.WritePoolCertificates):
// every agent of a pool is given the same directory (--tls-dir).
func certsCommand(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("agent certs", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", "", "directory to write tls.crt, tls.key and ca.crt into (created, mode 0700; must not hold them yet)")
	ns := fs.String("pool-namespace", "default", "the pool's namespace, as the agents' --pool-namespace")
	name := fs.String("pool-name", "kv", "the pool's name, as the agents' --pool-name")
	validity := fs.Duration("validity", 24*time.Hour, "how long the certificates are valid (at most a year)")
	if err := fs.Parse(args); err != nil {
		return parseFailed(err)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "agent certs: unexpected arguments %q\n", fs.Args())
		return errUsage
	}
	switch {
	case *dir == "":
		fmt.Fprintln(stderr, "agent certs: --dir is required")
		return errUsage
	case *validity <= 0 || *validity > maxCertValidity:
		fmt.Fprintf(stderr, "agent certs: --validity %v: want more than 0 and at most %v\n", *validity, maxCertValidity)
		return errUsage
	}
	if err := node.CheckPoolRef(*ns, *name); err != nil {
		fmt.Fprintf(stderr, "agent certs: %v\n", err)
		return errUsage
	}
	if err := node.WritePoolCertificates(*dir, *ns, *name, *validity); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote the agent certificates of pool %s/%s into %s (valid %v)\n", *ns, *name, *dir, *validity)
	return nil
}
