#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""Median time between the fast socket's phase marks in an agent trace (agent standalone --trace=FILE):

    go tool trace -d=parsed FILE | hack/trace-phases.py

Each request on a fast connection logs "frame read", then "decoded" / "planned" (block transfers),
"submitted", "settled" (waited transfers) and "replied"; this prints the median and p90 of each step.
"""
import re
import statistics
import sys
from collections import defaultdict

ORDER = ["frame read", "decoded", "planned", "submitted", "settled", "replied"]
line_re = re.compile(r'G=(\d+) Log Time=(\d+) .*Message="([^"]+)"')
open_req = {}
steps = defaultdict(list)
for line in sys.stdin:
    m = line_re.search(line)
    if not m:
        continue
    g, t, msg = m.group(1), int(m.group(2)), m.group(3)
    if msg not in ORDER:
        continue
    if msg == "frame read":
        open_req[g] = [(msg, t)]
        continue
    marks = open_req.get(g)
    if not marks:
        continue
    marks.append((msg, t))
    if msg == "replied":
        for (a, ta), (b, tb) in zip(marks, marks[1:]):
            steps["%s -> %s" % (a, b)].append(tb - ta)
        steps["frame read -> replied"].append(t - marks[0][1])
        del open_req[g]
for k, v in sorted(steps.items(), key=lambda kv: ORDER.index(kv[0].split(" -> ")[1]) + (10 if kv[0].startswith("frame read -> replied") else 0)):
    v.sort()
    print("%-28s n=%5d median %8.1f us  p90 %8.1f" % (k, len(v), statistics.median(v) / 1e3, v[int(len(v) * 0.9)] / 1e3))
