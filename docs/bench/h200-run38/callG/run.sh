#!/bin/bash
# Session 38, call F: the decode table at B = 1 and 4 after the counter pool's fix (16-byte slices, 4 MiB kept free).
python3 -c "import xdsl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD:$PWD/bench ATTNFUSE_CACHE_DIR=$(mktemp -d)
timeout 190 python3 bench/decode.py --out $OUT/dec --graphs --sq 1 --rope --no-flex \
  --batches 1,4 --kv 1024,8192,32768,131072 --no-baseline-pipeline > $OUT/dec.log 2>&1
echo "rc $?" >> $OUT/dec.log
grep -v '^{' $OUT/dec.log | tail -40
