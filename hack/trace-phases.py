#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""Time between the fast socket's phase marks in an agent trace (agent standalone --trace=FILE):

    go tool trace -d=parsed FILE | hack/trace-phases.py [--last N]

Each request on a fast connection logs "frame read", then "decoded" / "planned" (block transfers),
"submitted", "settled" (waited transfers) and "replied"; any other mark a build logs on the same goroutine in
between (a diagnostic build's marks inside the copier, say) becomes a step of its own. For each step this prints
the median, p90 and p99, and the median of that step within the slowest 1% of requests (by frame read to
reply); last, which step took longest in each of those, which says where a tail is spent. --last N keeps the last N requests only (one benchmark case's),
--skip N leaves the last N of those out (the cases after it). It also counts the collector's mark phases within
the requests kept and how many of the slowest 1% overlap one, which says whether the collector made the tail.
"""
import argparse
import re
import statistics
import sys
from collections import defaultdict

line_re = re.compile(r'G=(\d+) Log Time=(\d+) .*Message="([^"]+)"')
range_re = re.compile(r'Range(Begin|End) Time=(\d+) Name="GC concurrent mark phase"')


def requests(lines, marks_out):
    """Each request as its list of (mark, time in ns), from "frame read" to "replied" on one goroutine; the
    collector's mark phases, (begin, end) in ns, are appended to marks_out as they are read."""
    open_req = {}
    begun = None
    for line in lines:
        r = range_re.search(line)
        if r:
            if r.group(1) == "Begin":
                begun = int(r.group(2))
            elif begun is not None:
                marks_out.append((begun, int(r.group(2))))
                begun = None
            continue
        m = line_re.search(line)
        if not m:
            continue
        g, t, msg = m.group(1), int(m.group(2)), m.group(3)
        if msg == "frame read":
            open_req[g] = [(msg, t)]
            continue
        marks = open_req.get(g)
        if marks is None:
            continue
        marks.append((msg, t))
        if msg == "replied":
            yield marks
            del open_req[g]


def steps_of(reqs):
    steps, order = defaultdict(list), []
    for marks in reqs:
        for (a, ta), (b, tb) in zip(marks, marks[1:]):
            k = "%s -> %s" % (a, b)
            if k not in steps:
                order.append(k)
            steps[k].append(tb - ta)
        steps["frame read -> replied"].append(marks[-1][1] - marks[0][1])
    return steps, order + ["frame read -> replied"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--last", type=int, default=0, help="keep only the last N requests")
    p.add_argument("--skip", type=int, default=0, help="of those, leave the last N out")
    a = p.parse_args()
    gc = []
    reqs = list(requests(sys.stdin, gc))
    if a.last:
        reqs = reqs[-a.last:]
    if a.skip:
        reqs = reqs[:-a.skip]
    if not reqs:
        print("no request marks in the trace")
        return 1
    slowest = sorted(reqs, key=lambda r: r[-1][1] - r[0][1])[-max(1, len(reqs) // 100):]
    steps, order = steps_of(reqs)
    slow, _ = steps_of(slowest)
    # In each of the slowest requests, the step that took longest: one step every time is a cost to remove, a
    # different one each time is the process being interrupted.
    longest = defaultdict(int)
    for marks in slowest:
        gaps = [(tb - ta, "%s -> %s" % (a, b)) for (a, ta), (b, tb) in zip(marks, marks[1:])]
        longest[max(gaps)[1]] += 1
    print("%d requests; slowest 1%%: %d" % (len(reqs), len(slowest)))
    for k in order:
        v = sorted(steps[k])
        s = slow.get(k)
        print("%-28s n=%5d median %7.1f us  p90 %7.1f  p99 %7.1f  slowest 1%%: median %7.1f" % (
            k, len(v), statistics.median(v) / 1e3, v[int(len(v) * 0.9)] / 1e3, v[int(len(v) * 0.99)] / 1e3,
            statistics.median(s) / 1e3 if s else float("nan")))
    print("longest step in each of the slowest 1%: " + ", ".join("%s %d" % (k, n) for k, n in
                                                                  sorted(longest.items(), key=lambda kv: -kv[1])))
    whole = sorted(steps["frame read -> replied"])
    print("frame read -> replied p99.9 %.1f us, slowest %.1f us" % (whole[int(len(whole) * 0.999)] / 1e3,
                                                                    whole[-1] / 1e3))
    if reqs:
        first, last = reqs[0][0][1], reqs[-1][-1][1]
        within = [(b, e) for b, e in gc if b < last and first < e]

        def during(marks):
            return any(b < marks[-1][1] and marks[0][1] < e for b, e in within)

        print("collector mark phases within these requests' %.1f ms: %d; of the slowest 1%%, %d overlap one" % (
            (last - first) / 1e6, len(within), sum(1 for m in slowest if during(m))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
