#!/bin/bash
# Session 36, call H: the fill rule at short paged caches, and the GPU paged tests.
python3 -c "import xdsl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD:$PWD/bench ATTNFUSE_CACHE_DIR=$(mktemp -d)
start=$(date +%s)
git log -1 --format=%H > $OUT/gpu.txt
OUT=$OUT timeout 60 python3 .gpu/probe36d.py > $OUT/probe.log 2>&1
echo "probe rc $? at $(( $(date +%s) - start )) s" >> $OUT/probe.log
timeout 170 python3 -m pytest -q tests/gpu/test_paged_gpu.py --junitxml=$OUT/tests.xml > $OUT/tests.log 2>&1
echo "rc $? at $(( $(date +%s) - start )) s" >> $OUT/tests.log
