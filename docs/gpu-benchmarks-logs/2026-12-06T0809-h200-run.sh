#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# On any GPU: the copier's GPU tests, the Python GPU tests in both allocator modes and the Go client's GPU test and
# benchmark against a standalone agent, and that agent's GPU copier metrics. On an H200 only: the done-when's cases, five agent starts, then five more of
# the contiguous cases alone.
set -u
{ date -u; nvidia-smi --query-gpu=name,driver_version,compute_mode,clocks.sm,clocks.mem --format=csv; nproc; } > $OUT/machine.txt 2>&1
python3 -c "
import lzma,shutil,os
for n in ('agent-new','cudacopy.test','client.test'):
    with lzma.open('.gpuc/%s.xz' % n) as f, open('/tmp/%s' % n,'wb') as o: shutil.copyfileobj(f,o)
    os.chmod('/tmp/%s' % n,0o755)"
[[ -n "${SKIP_CUDACOPY:-}" ]] || (cd engines/gpu/cudacopy && timeout 200 /tmp/cudacopy.test -test.run GPU -test.v > $OUT/cudacopy-gpu-tests.txt 2>&1; echo "$(date -u +%T) cudacopy GPU tests rc $?" >> $OUT/machine.txt)
mkdir -p /tmp/fx
/tmp/agent-new standalone --socket-dir /tmp/fx --pool-name kv --health-addr 127.0.0.1:9477 > $OUT/agent.log 2>&1 &
pid=$!
for _ in $(seq 100); do [[ -S /tmp/fx/kv/agent.sock ]] && break; sleep 0.2; done
python3 -c "import urllib.request;print(''.join(l for l in urllib.request.urlopen('http://127.0.0.1:9477/metrics').read().decode().splitlines(True) if 'gpu_cop' in l and not l.startswith('#')))" > $OUT/metrics-before.txt 2>&1
(cd client/python && FABRICXFER_SOCKET=/tmp/fx/kv/agent.sock timeout 180 python3 -m unittest -v tests.test_gpu tests.test_ids > $OUT/pytests.txt 2>&1; echo "$(date -u +%T) pytests caching rc $?" >> $OUT/machine.txt
 echo "=== expandable segments" >> $OUT/pytests.txt
 FABRICXFER_SOCKET=/tmp/fx/kv/agent.sock PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 180 python3 -m unittest -v tests.test_gpu >> $OUT/pytests.txt 2>&1; echo "$(date -u +%T) pytests expandable rc $?" >> $OUT/machine.txt)
(cd client && FABRICXFER_SOCKET=/tmp/fx/kv/agent.sock timeout 240 /tmp/client.test -test.run GPUGoClient -test.bench GPUGoClient -test.count 3 -test.v > $OUT/go-client-gpu.txt 2>&1; echo "$(date -u +%T) Go client GPU test and benchmark rc $?" >> $OUT/machine.txt)
python3 -c "import urllib.request;print(''.join(l for l in urllib.request.urlopen('http://127.0.0.1:9477/metrics').read().decode().splitlines(True) if 'gpu_cop' in l and not l.startswith('#')))" > $OUT/metrics-after.txt 2>&1
kill $pid; wait $pid 2>/dev/null
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  for i in 1 2 3 4 5; do
    echo "=== full $i $(date -u +%T)" >> $OUT/full.txt
    timeout 120 python3 client/python/bench/bench_gpu.py --agent /tmp/agent-new --cases a,b,c64,c64-prep,c1g,c1g-prep,d >> $OUT/full.txt 2>&1
    echo "$(date -u +%T) full $i rc $?" >> $OUT/machine.txt
  done
  for i in 1 2 3 4 5; do
    echo "=== start $i $(date -u +%T)" >> $OUT/starts.txt
    timeout 60 python3 client/python/bench/bench_gpu.py --agent /tmp/agent-new --cases c64,c64-prep,c1g,c1g-prep >> $OUT/starts.txt 2>&1
    echo "$(date -u +%T) start $i rc $?" >> $OUT/machine.txt
  done
else
  echo "not an H200: the done-when's benchmarks not run" >> $OUT/machine.txt
fi
{ grep -hE '^(===|a 15|b 64|c 64|c 1 GiB|d 4)' $OUT/full.txt $OUT/starts.txt 2>/dev/null | grep -v ': done'; grep -E '^(Ran|OK|FAIL|ERROR)' $OUT/pytests.txt; grep -E '^(ok|FAIL|PASS|--- FAIL|--- SKIP)' $OUT/cudacopy-gpu-tests.txt; grep -E '^(---|Benchmark|ok|FAIL|PASS)|gpu_agent_test' $OUT/go-client-gpu.txt; echo "--- metrics before / after"; cat $OUT/metrics-before.txt $OUT/metrics-after.txt; grep -i "fast-path" $OUT/agent.log; cat $OUT/machine.txt; } > $OUT/summary.txt
date -u >> $OUT/machine.txt
cat $OUT/summary.txt
