#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# Main's agent and clients: the Python GPU tests in both allocator modes, then the done-when's cases (four
# sequential runs, two in ten alternating rounds), then six agent starts of the 64 MiB cases.
set -u
python3 -c "
import lzma,shutil,os
with lzma.open('.gpuc/agent-new.xz') as f, open('/tmp/agent-new','wb') as o: shutil.copyfileobj(f,o)
os.chmod('/tmp/agent-new',0o755)"
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; nproc; } > $OUT/machine.txt 2>&1
rm -rf /tmp/fx; mkdir -p /tmp/fx
/tmp/agent-new standalone --socket-dir /tmp/fx --pool-name kv --health-addr 127.0.0.1:9484 > $OUT/agent.log 2>&1 & pid=$!
for _ in $(seq 100); do [[ -S /tmp/fx/kv/agent.sock ]] && break; sleep 0.2; done
(cd client/python && FABRICXFER_SOCKET=/tmp/fx/kv/agent.sock timeout 150 python3 -m unittest tests.test_gpu tests.test_ids > $OUT/pytests.txt 2>&1; echo "$(date -u +%T) pytests caching rc $?" >> $OUT/machine.txt
 FABRICXFER_SOCKET=/tmp/fx/kv/agent.sock PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 150 python3 -m unittest tests.test_gpu tests.test_ids >> $OUT/pytests.txt 2>&1; echo "$(date -u +%T) pytests expandable rc $?" >> $OUT/machine.txt)
kill $pid; wait $pid 2>/dev/null
B="python3 client/python/bench/bench_gpu.py --agent /tmp/agent-new"
for i in 1 2 3 4; do echo "=== full $i $(date -u +%T)" >> $OUT/full.txt; timeout 100 $B --cases a,b,c64,c64-prep,c1g,c1g-prep,d >> $OUT/full.txt 2>&1; done
for i in 1 2; do echo "=== rounds $i $(date -u +%T)" >> $OUT/full.txt; timeout 100 $B --rounds 10 --cases a,b,c64,c64-prep,c1g,c1g-prep,d >> $OUT/full.txt 2>&1; done
for i in 1 2 3 4 5 6; do echo "=== start $i $(date -u +%T)" >> $OUT/full.txt; timeout 60 $B --cases c64,c64-prep,c64,c64-prep >> $OUT/full.txt 2>&1; done
date -u >> $OUT/machine.txt
cat $OUT/machine.txt; grep -E "^(Ran|OK|FAIL)" $OUT/pytests.txt; grep -hE '^(===|a 15|b 64|c 64|c 1 GiB|d 4)' $OUT/full.txt | grep -v ': done'
