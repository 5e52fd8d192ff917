#!/bin/bash
# Session 40, call G: the split-KV GPU tests after the test update.
python3 -c "import xdsl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD:$PWD/bench ATTNFUSE_CACHE_DIR=$(mktemp -d)
start=$(date +%s)
timeout 200 python3 -m pytest -q tests/gpu/test_split_kv_gpu.py --junitxml=$OUT/tests.xml > $OUT/tests.log 2>&1; echo "rc $? at $(( $(date +%s) - start ))" >> $OUT/tests.log
tail -3 $OUT/tests.log
