#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# On an H200: run31 (the done-when's runs with the thread sampler). Elsewhere: diag65 against eight agent starts,
# with the thread sampler.
set -u
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then bash .gpuc/run31.sh; exit; fi
# .gpuc/psr.py is 2026-12-06T1629-h100-psr.py, .gpuc/diag65.py 2026-12-06T1629-h100-diag65.py
python3 .gpuc/psr.py $OUT/psr.txt & spid=$!
trap "kill $spid" EXIT
python3 -c "
import lzma,shutil,os
with lzma.open('.gpuc/agent-new.xz') as f, open('/tmp/agent-new','wb') as o: shutil.copyfileobj(f,o)
os.chmod('/tmp/agent-new',0o755)"
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; nproc; lscpu | grep -E 'Model name|Thread|NUMA node0'; } > $OUT/machine.txt 2>&1
for i in $(seq 8); do
rm -rf /tmp/fx3; mkdir -p /tmp/fx3
/tmp/agent-new standalone --socket-dir /tmp/fx3 --pool-name kv > /dev/null 2>&1 & pid=$!
for _ in $(seq 100); do [[ -S /tmp/fx3/kv/agent.sock ]] && break; sleep 0.2; done
echo "=== start $i $(date -u +%T.%N | cut -c1-12) agent pid $pid" >> $OUT/diag65.txt
timeout 60 python3 .gpuc/diag65.py /tmp/fx3/kv/agent.sock >> $OUT/diag65.txt 2>&1
kill $pid; wait $pid 2>/dev/null
done
cat $OUT/machine.txt; grep -v CudaIPCTypes $OUT/diag65.txt
