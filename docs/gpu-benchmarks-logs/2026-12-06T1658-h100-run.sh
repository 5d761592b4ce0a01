#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# The command of this run: 2026-12-06T1629-h100-run.sh (.gpuc/run32.sh) with its H200 branch taken out, then four
# agent starts of the 64 MiB cases through bench_gpu.py.
sed -i 's/grep -q H200; then bash .gpuc\/run31.sh; exit; fi/grep -q NOPE; then exit; fi/' .gpuc/run32.sh; bash .gpuc/run32.sh > /dev/null 2>&1; B="python3 client/python/bench/bench_gpu.py --agent /tmp/agent-new"; for i in 1 2 3 4; do echo "=== start $i $(date -u +%T)" >> $OUT/full.txt; timeout 40 $B --cases c64,c64-prep,c64,c64-prep >> $OUT/full.txt 2>&1; done; cat $OUT/machine.txt; grep -v CudaIPC $OUT/diag65.txt | grep -E "===|ratios"; grep -hE '^(===|c 64)' $OUT/full.txt | grep -v ': done'
