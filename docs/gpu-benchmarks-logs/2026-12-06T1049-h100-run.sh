#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# The Python client's leaner plain call: old (HEAD) and new client alternated, replayed and real; the socket's
# contiguous cases alternated; the full done-when once; the Python GPU tests in both allocator modes.
set -u
python3 -c "
import lzma,shutil,os
for n in ('agent-new',):
    with lzma.open('.gpuc/%s.xz' % n) as f, open('/tmp/%s' % n,'wb') as o: shutil.copyfileobj(f,o)
    os.chmod('/tmp/%s' % n,0o755)"
rm -rf /tmp/old && mkdir -p /tmp/old && tar -xf .gpuc/oldpy.tar -C /tmp/old
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; nproc; python3 -c "import sys,google.protobuf as g; from google.protobuf.internal import api_implementation as a; print(sys.version, g.__version__, a.Type())"; } > $OUT/machine.txt 2>&1
rm -rf /tmp/fx; mkdir -p /tmp/fx
/tmp/agent-new standalone --socket-dir /tmp/fx --pool-name kv --health-addr 127.0.0.1:9484 > $OUT/agent.log 2>&1 & pid=$!
for _ in $(seq 100); do [[ -S /tmp/fx/kv/agent.sock ]] && break; sleep 0.2; done
for i in 1 2; do for v in old new; do
  r=client/python; [[ $v == old ]] && r=/tmp/old/client/python
  timeout 100 python3 .gpuc/share2.py /tmp/fx/kv/agent.sock $r $v >> $OUT/share.txt 2>&1
done; done
(cd client/python && FABRICXFER_SOCKET=/tmp/fx/kv/agent.sock timeout 150 python3 -m unittest tests.test_gpu tests.test_ids > $OUT/pytests.txt 2>&1; echo "$(date -u +%T) pytests caching rc $?" >> $OUT/machine.txt
 FABRICXFER_SOCKET=/tmp/fx/kv/agent.sock PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 150 python3 -m unittest tests.test_gpu >> $OUT/pytests.txt 2>&1; echo "$(date -u +%T) pytests expandable rc $?" >> $OUT/machine.txt)
kill $pid; wait $pid 2>/dev/null
for i in 1 2 3; do for v in old new; do
  b=client/python/bench/bench_gpu.py; [[ $v == old ]] && b=/tmp/old/client/python/bench/bench_gpu.py
  echo "=== $v $i $(date -u +%T)" >> $OUT/ab.txt
  timeout 100 python3 $b --agent /tmp/agent-new --cases c64,c64-prep,d >> $OUT/ab.txt 2>&1
done; done
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  echo "=== full new $(date -u +%T)" >> $OUT/full.txt
  timeout 120 python3 client/python/bench/bench_gpu.py --agent /tmp/agent-new --cases a,b,c64,c64-prep,c1g,c1g-prep,d >> $OUT/full.txt 2>&1
fi
date -u >> $OUT/machine.txt
cat $OUT/machine.txt; cat $OUT/share.txt; grep -E "^(Ran|OK|FAIL)" $OUT/pytests.txt; grep -hE '^(===|c 64|d 4)' $OUT/ab.txt | grep -v ': done'; [[ -f $OUT/full.txt ]] && grep -hE '^(===|a 15|b 64|c 64|c 1 GiB|d 4)' $OUT/full.txt | grep -v ': done'
