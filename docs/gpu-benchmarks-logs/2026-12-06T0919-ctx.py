# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# Context switches of a process's threads and the machine's IPIs, snapshot for before/after deltas.
import json, os, sys
pid = sys.argv[1]
out = {"vol": 0, "invol": 0, "threads": 0}
for t in os.listdir("/proc/%s/task" % pid):
    try:
        for line in open("/proc/%s/task/%s/status" % (pid, t)):
            if line.startswith("voluntary_ctxt_switches"):
                out["vol"] += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches"):
                out["invol"] += int(line.split()[1])
        out["threads"] += 1
    except OSError:
        pass
for line in open("/proc/interrupts"):
    f = line.split()
    if f and f[0] in ("RES:", "CAL:", "TLB:", "LOC:"):
        out[f[0][:-1]] = sum(int(x) for x in f[1:] if x.isdigit())
print(json.dumps(out))
