#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# HEAD's agent and client: on an H200 the done-when's cases four times (all of ours then all of torch's), twice in
# ten alternating rounds, and eight agent starts of the 64 MiB cases; elsewhere one full run and four starts. Then
# the Python GPU tests in both allocator modes.
set -u
python3 -c "
import lzma,shutil,os
with lzma.open('.gpuc/agent-new.xz') as f, open('/tmp/agent-new','wb') as o: shutil.copyfileobj(f,o)
os.chmod('/tmp/agent-new',0o755)"
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; nproc; } > $OUT/machine.txt 2>&1
H200=0; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && H200=1
B="python3 client/python/bench/bench_gpu.py --agent /tmp/agent-new"
if [[ $H200 == 1 ]]; then NF=4; NR=2; NS=8; else NF=1; NR=0; NS=4; fi
for i in $(seq $NF); do echo "=== full $i $(date -u +%T)" >> $OUT/full.txt; timeout 90 $B --cases a,b,c64,c64-prep,c1g,c1g-prep,d >> $OUT/full.txt 2>&1; done
for i in $(seq $NR); do echo "=== rounds 10 $i $(date -u +%T)" >> $OUT/full.txt; timeout 90 $B --rounds 10 --cases a,b,c64,c64-prep,c1g,c1g-prep,d >> $OUT/full.txt 2>&1; done
for i in $(seq $NS); do echo "=== start $i $(date -u +%T)" >> $OUT/full.txt; timeout 60 $B --cases c64,c64-prep,c64,c64-prep >> $OUT/full.txt 2>&1; done
rm -rf /tmp/fx; mkdir -p /tmp/fx
/tmp/agent-new standalone --socket-dir /tmp/fx --pool-name kv > /dev/null 2>&1 & pid=$!
for _ in $(seq 100); do [[ -S /tmp/fx/kv/agent.sock ]] && break; sleep 0.2; done
(cd client/python && FABRICXFER_SOCKET=/tmp/fx/kv/agent.sock timeout 150 python3 -m unittest tests.test_gpu tests.test_ids tests.test_fastconn > $OUT/pytests.txt 2>&1; echo "$(date -u +%T) pytests caching rc $?" >> $OUT/machine.txt
 FABRICXFER_SOCKET=/tmp/fx/kv/agent.sock PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 150 python3 -m unittest tests.test_gpu >> $OUT/pytests.txt 2>&1; echo "$(date -u +%T) pytests expandable rc $?" >> $OUT/machine.txt)
kill $pid; wait $pid 2>/dev/null
date -u >> $OUT/machine.txt
cat $OUT/machine.txt; grep -E "^(Ran|OK|FAIL)" $OUT/pytests.txt; grep -hE '^(===|a 15|b 64|c 64|c 1 GiB|d 4)' $OUT/full.txt | grep -v ': done'
# the plain call's breakdown (client stamps), two agent starts
for i in 1 2; do
rm -rf /tmp/fx2; mkdir -p /tmp/fx2
/tmp/agent-new standalone --socket-dir /tmp/fx2 --pool-name kv > /dev/null 2>&1 & pid=$!
for _ in $(seq 100); do [[ -S /tmp/fx2/kv/agent.sock ]] && break; sleep 0.2; done
# .gpuc/diag64.py is docs/gpu-benchmarks-logs/2026-12-06T1427-h100-plain-vs-prepared.py
timeout 60 python3 .gpuc/diag64.py /tmp/fx2/kv/agent.sock >> $OUT/diag64.txt 2>&1
kill $pid; wait $pid 2>/dev/null
done
grep -E "total|short_ids" $OUT/diag64.txt
