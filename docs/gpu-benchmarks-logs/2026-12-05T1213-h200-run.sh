#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
# 041974a (old) against fdffea5 (new: the reply's status first, read alone by the client) through the socket
# cases, sequentially, three rounds; in each round also new with the whole run (agent, client, torch) held to the
# GPU's local CPUs (pinned). Then the Python GPU tests (new, both allocator modes), the stamped agent, the
# copier's GPU tests and its latency ladder. The machine's CPU layout first.
set -u
C=.gpuc/carry5
python3 -c "
import lzma,shutil,os
for v in ('agent-old','agent-new','agent-stamps','cudacopy.test'):
    with lzma.open('$C/%s.xz'%v) as f, open('/tmp/%s'%v,'wb') as o: shutil.copyfileobj(f,o)
    os.chmod('/tmp/%s'%v,0o755)"
{ date -u; nvidia-smi --query-gpu=name,driver_version,compute_mode,clocks.sm,clocks.mem,pci.bus_id --format=csv; nproc; lscpu | grep -vE '^(Flags|Vulnerab)'; nvidia-smi topo -m; } > $OUT/times.txt 2>&1
BDF=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | head -1 | tr 'A-Z' 'a-z' | sed 's/^0000\(....\)/\1/')
G=""; for d in /sys/bus/pci/devices/*; do case "$d" in *"${BDF: -12}") G=$d;; esac; done
LOCAL=$(cat $G/local_cpulist 2>/dev/null)
{ echo "gpu $G numa $(cat $G/numa_node 2>/dev/null) local_cpulist $LOCAL"; for n in /sys/devices/system/node/node*; do echo "$n $(cat $n/cpulist)"; done; cat /sys/devices/system/cpu/cpufreq/policy0/scaling_governor /sys/devices/system/cpu/cpuidle/current_driver 2>&1; } >> $OUT/times.txt 2>&1
[ -n "$LOCAL" ] || LOCAL=0-$(($(nproc)-1))
for r in 1 2 3; do
  for v in old new pinned; do
    A=/tmp/agent-$v; P=""; [ $v = pinned ] && { A=/tmp/agent-new; P="taskset -c $LOCAL"; }
    echo "=== $v round $r $(date -u +%T)" >> $OUT/socket.txt
    timeout 100 $P python3 client/python/bench/bench_gpu.py --agent $A --cases a,b,c64,c1g,d >> $OUT/socket.txt 2>&1
    echo "$(date -u +%T) $v round $r rc $?" >> $OUT/times.txt
  done
done
mkdir -p /tmp/fx
/tmp/agent-new standalone --socket-dir /tmp/fx --pool-name kv > /tmp/fx-agent.log 2>&1 &
AP=$!
for i in $(seq 50); do [ -S /tmp/fx/kv/agent.sock ] && break; sleep 0.2; done
(cd client/python && FABRICXFER_SOCKET=/tmp/fx/kv/agent.sock timeout 80 python3 -m unittest tests.test_gpu > $OUT/pytests.txt 2>&1; echo "$(date -u +%T) pytests caching rc $?" >> $OUT/times.txt
 echo "=== expandable" >> $OUT/pytests.txt
 FABRICXFER_SOCKET=/tmp/fx/kv/agent.sock PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 80 python3 -m unittest tests.test_gpu >> $OUT/pytests.txt 2>&1; echo "$(date -u +%T) pytests expandable rc $?" >> $OUT/times.txt)
kill $AP; wait $AP 2>/dev/null
PYTHONUNBUFFERED=1 timeout 80 python3 $C/stamped.py /tmp/agent-stamps $OUT/stamps.csv > $OUT/stamped.txt 2>&1
echo "$(date -u +%T) stamped rc $?" >> $OUT/times.txt
(cd engines/gpu/cudacopy && timeout 150 /tmp/cudacopy.test -test.run 'TestGPU' -test.v -test.timeout 140s > $OUT/gotests.txt 2>&1)
echo "$(date -u +%T) gotests rc $?" >> $OUT/times.txt
(cd engines/gpu/cudacopy && timeout 60 /tmp/cudacopy.test -test.run xxx -test.bench 'GPULatencyLadder/1x(4KiB|64MiB)' -test.benchtime 20000x > $OUT/ladder.txt 2>&1)
echo "$(date -u +%T) ladder rc $?" >> $OUT/times.txt
date -u >> $OUT/times.txt
