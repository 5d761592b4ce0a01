// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package xferctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// completionTimeout bounds an API request made while a shell waits for a tab press.
const completionTimeout = 5 * time.Second

// The hidden requests cobra's completion scripts (and kubectl, through kubectl_complete-fabricxfer) send.
const (
	completeRequest       = cobra.ShellCompRequestCmd
	completeRequestNoDesc = cobra.ShellCompNoDescRequestCmd
)

// runCompletion answers "completion bash|zsh|fish|powershell" and the scripts' __complete requests. The
// commands themselves keep their own dispatch (Run); this cobra tree only describes them, so completion
// follows commands() and each command's flag definitions.
func runCompletion(ctx context.Context, p Program, args []string, stdout, stderr io.Writer) int {
	// cobra answers a shell it has no script for with its help and success; a caller piping the output into
	// its shell's setup should hear that nothing was written.
	if len(args) == 2 && args[0] == "completion" && !slices.Contains([]string{"bash", "zsh", "fish", "powershell"}, args[1]) {
		fmt.Fprintf(stderr, "%s: no completion script for the shell %q (bash, zsh, fish or powershell)\n", p.displayName(), args[1])
		return 2
	}
	root := completionTree(ctx, p)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", p.displayName(), err)
		return 2
	}
	return 0
}

func completionTree(ctx context.Context, p Program) *cobra.Command {
	root := &cobra.Command{
		Use:           p.Name, // the scripts are named after, and register for, the executable
		Short:         "inspect and exercise fabricxfer",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	for _, c := range commands(p) {
		sub := &cobra.Command{
			Use:   c.name,
			Short: c.summary,
			// Never called: Run dispatches the commands; a Run makes cobra list the command as available.
			Run: func(*cobra.Command, []string) {},
		}
		fs := pflag.NewFlagSet(c.name, pflag.ContinueOnError)
		// "-h" too: a command that parsed its flags without parseFlags would print its help, not run.
		if err := c.run(withFlagSink(ctx, fs), []string{"-h"}, io.Discard, io.Discard); err != nil && !errors.Is(err, errFlagsCollected) && !errors.Is(err, errUsage) {
			continue
		}
		sub.Flags().AddFlagSet(fs)
		if c.name == "status" {
			registerKubeCompletions(sub)
		}
		root.AddCommand(sub)
	}
	root.AddCommand(&cobra.Command{Use: "version", Short: "print the version", Run: func(*cobra.Command, []string) {}})
	return root
}

// registerKubeCompletions completes --output, --context, --cluster, --user and --namespace of a
// Kubernetes-facing command from the kubeconfig and the API server, as kubectl does.
func registerKubeCompletions(cmd *cobra.Command) {
	fixed := func(values ...string) cobra.CompletionFunc {
		return cobra.FixedCompletions(values, cobra.ShellCompDirectiveNoFileComp)
	}
	_ = cmd.RegisterFlagCompletionFunc("output", fixed(outputFormats()...))
	kube := func(cmd *cobra.Command) *genericclioptions.ConfigFlags {
		// The flags the command line gave so far (--kubeconfig, --context) decide which cluster to ask.
		cf := genericclioptions.NewConfigFlags(false)
		fs := pflag.NewFlagSet("completion", pflag.ContinueOnError)
		cf.AddFlags(fs)
		cmd.Flags().Visit(func(f *pflag.Flag) {
			if fs.Lookup(f.Name) != nil {
				_ = fs.Set(f.Name, f.Value.String())
			}
		})
		return cf
	}
	fromKubeconfig := func(pick func(name string, ctx, cluster, user bool) bool) cobra.CompletionFunc {
		return func(cmd *cobra.Command, _ []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
			raw, err := kube(cmd).ToRawKubeConfigLoader().RawConfig()
			if err != nil {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			var names []string
			for n := range raw.Contexts {
				if pick(n, true, false, false) {
					names = append(names, n)
				}
			}
			for n := range raw.Clusters {
				if pick(n, false, true, false) {
					names = append(names, n)
				}
			}
			for n := range raw.AuthInfos {
				if pick(n, false, false, true) {
					names = append(names, n)
				}
			}
			sort.Strings(names)
			return names, cobra.ShellCompDirectiveNoFileComp
		}
	}
	_ = cmd.RegisterFlagCompletionFunc("context", fromKubeconfig(func(_ string, c, _, _ bool) bool { return c }))
	_ = cmd.RegisterFlagCompletionFunc("cluster", fromKubeconfig(func(_ string, _, c, _ bool) bool { return c }))
	_ = cmd.RegisterFlagCompletionFunc("user", fromKubeconfig(func(_ string, _, _, u bool) bool { return u }))
	_ = cmd.RegisterFlagCompletionFunc("namespace", func(cmd *cobra.Command, _ []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
		names, err := listNames(cmd.Context(), kube(cmd), &metav1.PartialObjectMetadataList{
			TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "NamespaceList"}})
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return names, cobra.ShellCompDirectiveNoFileComp
	})
}

// listNames lists the names of the objects of a kind, reading metadata only.
func listNames(ctx context.Context, cf *genericclioptions.ConfigFlags, list *metav1.PartialObjectMetadataList) ([]string, error) {
	restCfg, err := cf.ToRESTConfig()
	if err != nil {
		return nil, fmt.Errorf("loading the API server configuration: %w", err)
	}
	scheme, err := statusScheme()
	if err != nil {
		return nil, err
	}
	if err := corev1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	c, err := client.New(restCfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("connecting to the API server: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, completionTimeout)
	defer cancel()
	if err := c.List(ctx, list); err != nil {
		return nil, fmt.Errorf("listing %s: %w", list.Kind, err)
	}
	names := make([]string, 0, len(list.Items))
	for _, o := range list.Items {
		names = append(names, o.Name)
	}
	return names, nil
}
