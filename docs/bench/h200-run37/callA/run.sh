#!/bin/bash
# Session 37, call A: GPU tests of paged/split-KV (incl. the never-run cache-with-lengths test) and
# a short decode table with the "with lengths" column.
python3 -c "import xdsl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD:$PWD/bench ATTNFUSE_CACHE_DIR=$(mktemp -d)
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/gpu.txt
timeout 250 python3 -m pytest -q tests/gpu/test_paged_gpu.py tests/gpu/test_split_kv_gpu.py \
  --junitxml=$OUT/tests.xml > $OUT/tests.log 2>&1
echo "rc $? at $(( $(date +%s) - start )) s" >> $OUT/tests.log
timeout $(( 540 - ($(date +%s) - start) )) python3 bench/decode.py --out $OUT/decode --graphs --sq 1 --batches 1,16 --kv 1024,8192 --rope > $OUT/decode.log 2>&1
echo "decode rc $? at $(( $(date +%s) - start )) s" >> $OUT/decode.log
