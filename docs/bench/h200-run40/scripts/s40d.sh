#!/bin/bash
# Session 40, call D: B = 64 probe 2; host time per call again (bench_overhead).
python3 -c "import xdsl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD:$PWD/bench ATTNFUSE_CACHE_DIR=$(mktemp -d)
start=$(date +%s)
nproc > $OUT/machine.txt; uptime >> $OUT/machine.txt
timeout 300 python3 .gpu/s40_b64b.py > $OUT/b64probe2.log 2>&1; echo "rc $? at $(( $(date +%s) - start ))" >> $OUT/b64probe2.log
timeout $(( 560 - ($(date +%s) - start) )) python3 bench/bench_overhead.py --out $OUT/overhead.json > $OUT/overhead.log 2>&1; echo "rc $? at $(( $(date +%s) - start ))" >> $OUT/overhead.log
grep -v '^{' $OUT/b64probe2.log | tail -9; head -12 $OUT/overhead.log; cat $OUT/machine.txt
