#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# Agents before and after polling loops offer their cores: client stamps aligned with agent traces (case a with
# ids drawn by torch's thread pool between calls, and the 64 MiB copy); then the socket cases with the new agent
# and the Python GPU tests; on an H200, the done-when's cases first.
set -u
python3 -c "
import lzma,shutil,os
for n in ('agent-new','agent-old'):
    with lzma.open('.gpuc/%s.xz' % n) as f, open('/tmp/%s' % n,'wb') as o: shutil.copyfileobj(f,o)
    os.chmod('/tmp/%s' % n,0o755)"
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; nproc; } > $OUT/machine.txt 2>&1
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  B="python3 client/python/bench/bench_gpu.py --agent /tmp/agent-new"
  for i in 1 2 3 4; do echo "=== full $i $(date -u +%T)" >> $OUT/full.txt; timeout 100 $B --cases a,b,c64,c64-prep,c1g,c1g-prep,d >> $OUT/full.txt 2>&1; done
  for i in 1 2; do echo "=== rounds $i $(date -u +%T)" >> $OUT/full.txt; timeout 100 $B --rounds 10 --cases a,b,c64,c64-prep,c1g,c1g-prep,d >> $OUT/full.txt 2>&1; done
  for i in 1 2 3 4 5 6; do echo "=== start $i $(date -u +%T)" >> $OUT/full.txt; timeout 60 $B --cases c64,c64-prep,c64,c64-prep >> $OUT/full.txt 2>&1; done
fi
for v in old new old new; do
  rm -rf /tmp/fx; mkdir -p /tmp/fx
  /tmp/agent-$v standalone --socket-dir /tmp/fx --pool-name kv --trace=/tmp/$v.trace > /dev/null 2>&1 & pid=$!
  for _ in $(seq 100); do [[ -S /tmp/fx/kv/agent.sock ]] && break; sleep 0.2; done
  MODE=torch timeout 100 python3 .gpuc/astamp.py /tmp/fx/kv/agent.sock /tmp/stamps-$v.json >> $OUT/machine.txt 2>&1
  kill -INT $pid; wait $pid 2>/dev/null
done
gzip -c /tmp/old.trace > $OUT/old.trace.gz; gzip -c /tmp/new.trace > $OUT/new.trace.gz; cp /tmp/stamps-old.json /tmp/stamps-new.json $OUT/
rm -rf /tmp/fx; mkdir -p /tmp/fx
/tmp/agent-new standalone --socket-dir /tmp/fx --pool-name kv > /dev/null 2>&1 & pid=$!
for _ in $(seq 100); do [[ -S /tmp/fx/kv/agent.sock ]] && break; sleep 0.2; done
(cd client/python && FABRICXFER_SOCKET=/tmp/fx/kv/agent.sock timeout 150 python3 -m unittest tests.test_gpu tests.test_ids tests.test_fastconn > $OUT/pytests.txt 2>&1; echo "$(date -u +%T) pytests caching rc $?" >> $OUT/machine.txt
 FABRICXFER_SOCKET=/tmp/fx/kv/agent.sock PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 150 python3 -m unittest tests.test_gpu >> $OUT/pytests.txt 2>&1; echo "$(date -u +%T) pytests expandable rc $?" >> $OUT/machine.txt)
kill $pid; wait $pid 2>/dev/null
if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  for i in 1 2; do for v in old new; do
    echo "=== $v $i $(date -u +%T)" >> $OUT/ab.txt
    timeout 100 python3 client/python/bench/bench_gpu.py --agent /tmp/agent-$v --cases c64,c64-prep,d >> $OUT/ab.txt 2>&1
  done; done
fi
date -u >> $OUT/machine.txt
cat $OUT/machine.txt; grep -E "^(Ran|OK|FAIL)" $OUT/pytests.txt; [[ -f $OUT/ab.txt ]] && grep -hE '^(===|c 64|d 4)' $OUT/ab.txt | grep -v ': done'; [[ -f $OUT/full.txt ]] && grep -hE '^(===|a 15|b 64|c 64|c 1 GiB|d 4)' $OUT/full.txt | grep -v ': done'
