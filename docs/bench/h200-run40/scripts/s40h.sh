#!/bin/bash
# Session 40, call H: host time per call and per new launch plan after the plan-build change.
python3 -c "import xdsl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD:$PWD/bench ATTNFUSE_CACHE_DIR=$(mktemp -d)
start=$(date +%s)
timeout 150 python3 bench/bench_overhead.py --out $OUT/overhead.json > $OUT/overhead.log 2>&1; echo "rc $? at $(( $(date +%s) - start ))" >> $OUT/overhead.log
grep -v Warn $OUT/overhead.log | head -14
