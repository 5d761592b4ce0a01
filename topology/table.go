// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package topology

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
)

// WriteTable prints the report as an admin reads it first: GPUs, NICs, which NICs each GPU should use,
// engines with their reasons, then everything that could not be read.
func WriteTable(w io.Writer, r Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	p := func(format string, a ...any) { fmt.Fprintf(tw, format, a...) }

	p("GPUs (%d)\n", len(r.GPUs))
	if len(r.GPUs) > 0 {
		p("  IDX\tVENDOR\tMODEL\tPCI\tNUMA\tMEMORY\tPEERS\tFABRIC\n")
		for _, g := range r.GPUs {
			peers := "-"
			if len(g.XGMIPeers) > 0 {
				peers = intRanges(g.XGMIPeers)
			}
			if g.ActiveNVLinks > 0 {
				peers += fmt.Sprintf(" (%d NVLinks up)", g.ActiveNVLinks)
			}
			fabric := "- (" + orDash(g.FabricNote) + ")"
			if g.Fabric != nil {
				fabric = g.Fabric.Domain + " [" + g.Fabric.Source + "]"
				if g.FabricNote != "" {
					fabric += " (" + g.FabricNote + ")"
				}
			}
			model := orDash(g.Model)
			if g.Partitions > 0 {
				model += fmt.Sprintf(" (partition %d/%d)", g.Partition, g.Partitions)
			}
			if g.XGMIHive != "" {
				peers += " (hive " + g.XGMIHive + ")"
			}
			p("  %d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", g.Index, g.Vendor, model, orDash(g.PCIBusID),
				numa(g.NUMANode), bytesHuman(g.MemoryBytes), peers, fabric)
		}
	}
	if len(r.Declarations) > 0 {
		p("\nDeclared fabric domains (%d VPodTopologies name this node; what the hardware reports wins)\n", len(r.Declarations))
		p("  DECLARATION\tDOMAIN\tGPUs IN IT\tREFUSED\n")
		for _, d := range r.Declarations {
			gpus := "-"
			if len(d.GPUs) > 0 {
				gpus = intRanges(d.GPUs)
			}
			p("  %s\t%s\t%s\t%s\n", d.Name, d.Domain, gpus, orDash(d.Refused))
		}
	}
	p("\nRDMA ports (%d)\n", len(r.NICs))
	if len(r.NICs) > 0 {
		p("  NIC\tPORT\tSTATE\tLINK LAYER\tRoCE v2\tRATE\tPCI\tNUMA\tNEAREST GPUs\n")
		for _, n := range r.NICs {
			roce := "-"
			if n.LinkLayer == "Ethernet" {
				roce = yesNo(n.RoCEv2)
				if n.NetDev != "" {
					roce += " (" + n.NetDev + ")"
				}
			}
			rate := "-"
			if n.RateGbps > 0 {
				rate = strconv.Itoa(n.RateGbps) + " Gb/s"
			}
			nearest := "-"
			if len(n.NearestGPUs) > 0 {
				nearest = intRanges(n.NearestGPUs) + " (" + n.NearestLevel + ")"
			}
			p("  %s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Name, n.Port, orDash(n.State), orDash(n.LinkLayer), roce, rate,
				orDash(n.PCIBusID), numa(n.NUMANode), nearest)
		}
	}
	if len(r.GPUs) > 0 && len(r.NICs) > 0 {
		p("\nNICs per GPU, nearest first (PIX < PXB < PHB < NODE < SYS)\n")
		for _, g := range r.GPUs {
			var parts []string
			for i, n := range g.NICs {
				if i == 4 {
					parts = append(parts, fmt.Sprintf("... %d more", len(g.NICs)-4))
					break
				}
				parts = append(parts, fmt.Sprintf("%s/%d %s", n.NIC, n.Port, n.Level))
			}
			p("  GPU %d\t%s\n", g.Index, orDash(strings.Join(parts, ", ")))
		}
	}
	p("\nEngines\n")
	for _, e := range r.Engines {
		state := "unavailable"
		if e.Available {
			state = "available"
		}
		p("  %s\t%s\t%s\n", e.Name, state, e.Reason)
	}
	p("\nGPUDirect RDMA: dma-buf %s, peer-mem %s (%s)\n", yesNo(r.GPUDirect.DMABuf), yesNo(r.GPUDirect.PeerMem), orDash(r.GPUDirect.Evidence))
	if r.NVIDIADriver != "" {
		p("NVIDIA driver: %s\n", r.NVIDIADriver)
		p("NVSwitches on PCIe: %d; IMEX channel region registered: %s; IMEX channel devices: %d\n", r.NVSwitches, yesNo(r.IMEXRegistered), r.IMEXChannels)
	}
	var unread []string
	for _, u := range r.Unreadable {
		unread = append(unread, fmt.Sprintf("  node\t%s\t%s\n", u.Field, u.Reason))
	}
	for _, g := range r.GPUs {
		for _, u := range g.Unreadable {
			unread = append(unread, fmt.Sprintf("  GPU %d\t%s\t%s\n", g.Index, u.Field, u.Reason))
		}
	}
	for _, n := range r.NICs {
		for _, u := range n.Unreadable {
			unread = append(unread, fmt.Sprintf("  %s/%d\t%s\t%s\n", n.Name, n.Port, u.Field, u.Reason))
		}
	}
	p("\nUnreadable facts (%d)\n", len(unread))
	for _, line := range unread {
		p("%s", line)
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func numa(n int) string {
	if n < 0 {
		return "-"
	}
	return strconv.Itoa(n)
}

func bytesHuman(b int64) string {
	if b <= 0 {
		return "-"
	}
	const gib = 1 << 30
	if b >= gib {
		return fmt.Sprintf("%.0f GiB", float64(b)/gib)
	}
	return fmt.Sprintf("%d MiB", b>>20)
}
