#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# bench_gpu.py's done-when cases once on any GPU; on an H200 then agent starts of the 64 MiB cases until 150 s. Then, on any
# GPU, the Python GPU tests in both allocator modes and the Go client's GPU test and benchmarks.
set -u
T0=$SECONDS
python3 -c "
import lzma,shutil,os,tarfile
tarfile.open('.gpuc/pyclient.tar.xz').extractall('.')
with lzma.open('.gpuc/agent-new.xz') as f, open('/tmp/agent-new','wb') as o: shutil.copyfileobj(f,o)
os.chmod('/tmp/agent-new',0o755)
tarfile.open('.gpuc/gotests.tar.xz').extractall('/tmp/gt')"
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; nproc; cat .gpuc/agent-rev; } > $OUT/machine.txt 2>&1
B="python3 client/python/bench/bench_gpu.py --agent /tmp/agent-new"
H200=0; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && H200=1
echo "=== full 1 $(date -u +%T)" >> $OUT/full.txt; timeout 60 $B --cases a,b,c64,c64-prep,c1g,c1g-prep,d >> $OUT/full.txt 2>&1
if [[ $H200 == 1 ]]; then
  for i in $(seq 14); do (( SECONDS - T0 > 150 )) && break; echo "=== start $i $(date -u +%T)" >> $OUT/full.txt; timeout 30 $B --cases c64,c64-prep,c64,c64-prep >> $OUT/full.txt 2>&1; done
fi
rm -rf /tmp/fx; mkdir -p /tmp/fx
/tmp/agent-new standalone --socket-dir /tmp/fx --pool-name kv > $OUT/agent.log 2>&1 & pid=$!
for _ in $(seq 100); do [[ -S /tmp/fx/kv/agent.sock ]] && break; sleep 0.2; done
(cd client/python && FABRICXFER_SOCKET=/tmp/fx/kv/agent.sock timeout 90 python3 -m unittest -v tests.test_gpu tests.test_ids tests.test_fastconn tests.test_deadlines tests.test_client.ClientTest.test_memory_nobody_touched_is_refused_raw_and_populated_by_register_host > $OUT/pytests.txt 2>&1; echo "$(date -u +%T) pytests caching rc $?" >> $OUT/machine.txt
 FABRICXFER_SOCKET=/tmp/fx/kv/agent.sock PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 60 python3 -m unittest -v tests.test_gpu tests.test_ids >> $OUT/pytests.txt 2>&1; echo "$(date -u +%T) pytests expandable rc $?" >> $OUT/machine.txt)
(cd client && FABRICXFER_SOCKET=/tmp/fx/kv/agent.sock timeout 60 /tmp/gt/client.test -test.run GPUGoClient -test.bench GPUGoClient -test.benchtime 2000x -test.v > $OUT/go-client.txt 2>&1; echo "$(date -u +%T) go client rc $?" >> $OUT/machine.txt)
kill $pid; wait $pid 2>/dev/null
date -u >> $OUT/machine.txt
[[ -f $OUT/pytests.txt ]] && grep -E "^(Ran|OK|FAIL)|FAIL:|ERROR:" $OUT/pytests.txt
grep -E "^(--- |ok|FAIL)|p50-ns" $OUT/go-client.txt | sed 's/  */ /g'
cat $OUT/machine.txt; [[ -f $OUT/full.txt ]] && grep -hE '^(===|a 15|b 64|c 64|c 1 GiB|d 4)' $OUT/full.txt | grep -v ': done'
