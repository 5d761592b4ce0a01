#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# Client stamps aligned with an agent trace, case a and the 64 MiB copy, with the ids drawn three ways between
# calls (torch's randperm on its thread pool, on one thread, numpy's permutation).
set -u
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then exec bash .gpuc/run16.sh; fi
python3 -c "
import lzma,shutil,os
with lzma.open('.gpuc/agent-new.xz') as f, open('/tmp/agent-new','wb') as o: shutil.copyfileobj(f,o)
os.chmod('/tmp/agent-new',0o755)"
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; nproc; } > $OUT/machine.txt 2>&1
for m in torch torch1 numpy; do
  rm -rf /tmp/fx; mkdir -p /tmp/fx
  /tmp/agent-new standalone --socket-dir /tmp/fx --pool-name kv --trace=/tmp/$m.trace > /dev/null 2>&1 & pid=$!
  for _ in $(seq 100); do [[ -S /tmp/fx/kv/agent.sock ]] && break; sleep 0.2; done
  MODE=$m timeout 200 python3 .gpuc/astamp.py /tmp/fx/kv/agent.sock $OUT/stamps-$m.json >> $OUT/machine.txt 2>&1
  kill -INT $pid; wait $pid 2>/dev/null
  gzip -c /tmp/$m.trace > $OUT/$m.trace.gz
done
date -u >> $OUT/machine.txt
cat $OUT/machine.txt
