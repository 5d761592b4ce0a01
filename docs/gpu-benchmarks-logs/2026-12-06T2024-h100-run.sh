#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# HEAD's agent and client, with the thread sampler (2026-12-06T1629-h100-psr.py) beside: on an H200 the
# done-when's cases four times (all of ours then all of torch's), twice in ten alternating rounds, eight agent
# starts of the 64 MiB cases; elsewhere one full run and four starts. Then the Python GPU tests in both allocator
# modes, then the 64 MiB diagnostic (2026-12-06T1629-h100-diag65.py) against four agent starts.
set -u
python3 .gpuc/psr.py $OUT/psr.txt & spid=$!
trap "kill $spid" EXIT
python3 -c "
import lzma,shutil,os
with lzma.open('.gpuc/agent-new.xz') as f, open('/tmp/agent-new','wb') as o: shutil.copyfileobj(f,o)
os.chmod('/tmp/agent-new',0o755)"
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; nproc; lscpu | grep -E 'Model name|Thread|NUMA node0'; } > $OUT/machine.txt 2>&1
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
for i in 1 2 3 4; do
rm -rf /tmp/fx3; mkdir -p /tmp/fx3
/tmp/agent-new standalone --socket-dir /tmp/fx3 --pool-name kv > /dev/null 2>&1 & pid=$!
for _ in $(seq 100); do [[ -S /tmp/fx3/kv/agent.sock ]] && break; sleep 0.2; done
echo "=== start $i $(date -u +%T.%N | cut -c1-12) agent pid $pid" >> $OUT/diag65.txt
timeout 60 python3 .gpuc/diag65.py /tmp/fx3/kv/agent.sock >> $OUT/diag65.txt 2>&1
kill $pid; wait $pid 2>/dev/null
done
date -u >> $OUT/machine.txt
cat $OUT/machine.txt; grep -E "^(Ran|OK|FAIL)" $OUT/pytests.txt; grep -hE '^(===|a 15|b 64|c 64|c 1 GiB|d 4)' $OUT/full.txt | grep -v ': done'
grep -v CudaIPCTypes $OUT/diag65.txt | grep -E "===|plain|prep|total" | head -60
