#!/bin/bash
# Session 38, call E: the wide kernel, skipped empty loops and the merge by the last split
# program: GPU tests (split-KV, paged, CUDA graphs), then the decode table with RoPE.
python3 -c "import xdsl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD:$PWD/bench ATTNFUSE_CACHE_DIR=$(mktemp -d)
start=$(date +%s)
timeout 200 python3 -m pytest -q tests/gpu/test_split_kv_gpu.py tests/gpu/test_paged_gpu.py --junitxml=$OUT/tests.xml \
  > $OUT/tests.log 2>&1; echo "rc $? at $(( $(date +%s) - start )) s" >> $OUT/tests.log
timeout $(( 560 - ($(date +%s) - start) )) python3 bench/decode.py --out $OUT/dec --graphs --sq 1 --rope --no-flex \
  --batches 1,16,64 --kv 1024,8192,32768,131072 --no-baseline-pipeline > $OUT/dec.log 2>&1
echo "rc $? at $(( $(date +%s) - start )) s" >> $OUT/dec.log
tail -5 $OUT/tests.log; grep -v '^{' $OUT/dec.log | tail -45
