#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# Where the plain 64 MiB call's microseconds over a prepared run go (diag64.py, two agent starts).
set -u
python3 -c "
import lzma,shutil,os
with lzma.open('.gpuc/agent-new.xz') as f, open('/tmp/agent-new','wb') as o: shutil.copyfileobj(f,o)
os.chmod('/tmp/agent-new',0o755)"
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $OUT/diag.txt 2>&1
for i in 1 2; do
  rm -rf /tmp/fx; mkdir -p /tmp/fx
  /tmp/agent-new standalone --socket-dir /tmp/fx --pool-name kv > /dev/null 2>&1 & pid=$!
  for _ in $(seq 100); do [[ -S /tmp/fx/kv/agent.sock ]] && break; sleep 0.2; done
  echo "=== start $i $(date -u +%T)" >> $OUT/diag.txt
  timeout 100 python3 .gpuc/diag64.py /tmp/fx/kv/agent.sock >> $OUT/diag.txt 2>&1
  kill $pid; wait $pid 2>/dev/null
done
cat $OUT/diag.txt
