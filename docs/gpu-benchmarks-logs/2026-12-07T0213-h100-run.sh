#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# HEAD's Go GPU test binaries (cuda, cudacopy, fabric, poolmem), the Python GPU tests in both allocator modes
# and the Go client's GPU test against one standalone agent, then bench_gpu.py's done-when cases (on an H200
# twice, then eight agent starts of the 64 MiB cases; elsewhere once and four starts), the thread sampler beside.
set -u
T0=$SECONDS
python3 -c "import tarfile; tarfile.open('.gpuc/pyclient.tar.xz').extractall('.')"  # the committed Python client
python3 .gpuc/psr.py $OUT/psr.txt & spid=$!
trap "kill $spid" EXIT
python3 -c "
import lzma,shutil,os,tarfile
with lzma.open('.gpuc/agent-new.xz') as f, open('/tmp/agent-new','wb') as o: shutil.copyfileobj(f,o)
os.chmod('/tmp/agent-new',0o755)
os.makedirs('/tmp/gt',exist_ok=True)
tarfile.open('.gpuc/gotests.tar.xz').extractall('/tmp/gt')"
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; nproc; } > $OUT/machine.txt 2>&1
H200=0; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && H200=1
(cd engines/gpu/cuda && timeout 60 /tmp/gt/cuda.test -test.run GPU -test.v > $OUT/go-cuda.txt 2>&1; echo "$(date -u +%T) go cuda rc $?" >> $OUT/machine.txt)
(cd engines/gpu/cudacopy && timeout 200 /tmp/gt/cudacopy.test -test.run 'GPU|Shapes' -test.v > $OUT/go-cudacopy.txt 2>&1; echo "$(date -u +%T) go cudacopy rc $?" >> $OUT/machine.txt)
(cd engines/fabric && timeout 60 /tmp/gt/fabric.test -test.run GPU -test.v > $OUT/go-fabric.txt 2>&1; echo "$(date -u +%T) go fabric rc $?" >> $OUT/machine.txt)
(cd agent/poolmem && timeout 60 /tmp/gt/poolmem.test -test.run GPU -test.v > $OUT/go-poolmem.txt 2>&1; echo "$(date -u +%T) go poolmem rc $?" >> $OUT/machine.txt)
rm -rf /tmp/fx; mkdir -p /tmp/fx
/tmp/agent-new standalone --socket-dir /tmp/fx --pool-name kv > $OUT/agent.log 2>&1 & pid=$!
for _ in $(seq 100); do [[ -S /tmp/fx/kv/agent.sock ]] && break; sleep 0.2; done
(cd client/python && FABRICXFER_SOCKET=/tmp/fx/kv/agent.sock timeout 90 python3 -m unittest -v tests.test_gpu tests.test_ids tests.test_fastconn > $OUT/pytests.txt 2>&1; echo "$(date -u +%T) pytests caching rc $?" >> $OUT/machine.txt
 FABRICXFER_SOCKET=/tmp/fx/kv/agent.sock PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 90 python3 -m unittest -v tests.test_gpu >> $OUT/pytests.txt 2>&1; echo "$(date -u +%T) pytests expandable rc $?" >> $OUT/machine.txt)
(cd client && FABRICXFER_SOCKET=/tmp/fx/kv/agent.sock timeout 60 /tmp/gt/client.test -test.run GPUGoClient -test.v > $OUT/go-client.txt 2>&1; echo "$(date -u +%T) go client rc $?" >> $OUT/machine.txt)
kill $pid; wait $pid 2>/dev/null
B="python3 client/python/bench/bench_gpu.py --agent /tmp/agent-new"
if [[ $H200 == 1 ]]; then NF=2; NS=8; else NF=1; NS=4; fi
for i in $(seq $NF); do echo "=== full $i $(date -u +%T)" >> $OUT/full.txt; timeout 90 $B --cases a,b,c64,c64-prep,c1g,c1g-prep,d >> $OUT/full.txt 2>&1; done
for i in $(seq $NS); do (( SECONDS - T0 > 400 )) && break; echo "=== start $i $(date -u +%T)" >> $OUT/full.txt; timeout 60 $B --cases c64,c64-prep,c64,c64-prep >> $OUT/full.txt 2>&1; done
date -u >> $OUT/machine.txt
cat $OUT/machine.txt; grep -hE "^(--- FAIL|FAIL|ok|PASS)|panic" $OUT/go-*.txt | head -20; grep -c -- "--- PASS" $OUT/go-*.txt; grep -hE -- "--- SKIP" -A1 $OUT/go-*.txt | head -20
grep -E "^(Ran|OK|FAIL)|ipc_region|past_its|FAIL:|ERROR:" $OUT/pytests.txt; grep -hE '^(===|a 15|b 64|c 64|c 1 GiB|d 4)' $OUT/full.txt | grep -v ': done'
