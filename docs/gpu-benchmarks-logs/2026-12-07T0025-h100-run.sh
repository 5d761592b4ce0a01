#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# Main at 190363c on a warm H100 (a call for an H200 that got an H100): the Python GPU tests in both allocator
# modes against one standalone agent, then bench_gpu.py's done-when cases once.
set -u; python3 -c "
import lzma,shutil,os
with lzma.open('.gpuc/agent-new.xz') as f, open('/tmp/agent-new','wb') as o: shutil.copyfileobj(f,o)
os.chmod('/tmp/agent-new',0o755)"; uname -r; rm -rf /tmp/fx; mkdir -p /tmp/fx; /tmp/agent-new standalone --socket-dir /tmp/fx --pool-name kv > $OUT/agent.log 2>&1 & pid=$!; for _ in $(seq 100); do [[ -S /tmp/fx/kv/agent.sock ]] && break; sleep 0.2; done; (cd client/python && FABRICXFER_SOCKET=/tmp/fx/kv/agent.sock timeout 50 python3 -m unittest tests.test_gpu tests.test_ids > $OUT/pytests.txt 2>&1; echo "caching rc $?"; FABRICXFER_SOCKET=/tmp/fx/kv/agent.sock PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 40 python3 -m unittest tests.test_gpu >> $OUT/pytests.txt 2>&1; echo "expandable rc $?"); kill $pid; wait $pid 2>/dev/null; grep -E "^(Ran|OK|FAIL)" $OUT/pytests.txt; timeout 60 python3 client/python/bench/bench_gpu.py --agent /tmp/agent-new --cases a,b,c64,c64-prep,c1g,c1g-prep,d > $OUT/full.txt 2>&1; grep -E '^(a 15|b 64|c 64|c 1 GiB|d 4)' $OUT/full.txt | grep -v ': done'; date -u
