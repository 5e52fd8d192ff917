#!/bin/bash
# Session 38, call A (prepared in session 37): the never-run GPU tests of the bottom-right rope,
# the RoPE decode table with the aligned column, and paged B = 16 at short caches with the
# contiguous split rule (waves 1, min-blocks 1: one split of 16 blocks, no combine).
python3 -c "import xdsl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD:$PWD/bench ATTNFUSE_CACHE_DIR=$(mktemp -d)
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
python3 -c "import flash_attn; print(\"flash_attn\", flash_attn.__version__)" >> $OUT/gpu.txt 2>&1
timeout 150 python3 -m pytest -q tests/gpu/test_split_kv_gpu.py tests/gpu/test_paged_gpu.py -k "rope" \
  --junitxml=$OUT/tests.xml > $OUT/tests.log 2>&1
echo "rc $? at $(( $(date +%s) - start )) s" >> $OUT/tests.log
timeout 200 python3 bench/decode.py --out $OUT/rope --graphs --sq 1 --rope --batches 1,16 --kv 1024,8192 \
  --no-baseline-pipeline > $OUT/rope.log 2>&1
echo "rope rc $? at $(( $(date +%s) - start )) s" >> $OUT/rope.log
timeout 90 python3 bench/decode.py --out $OUT/kern --batches 1 --kv 8192 --sq 1 --kernels --no-flex --page-size 0 \
  --no-baseline-pipeline > $OUT/kern.log 2>&1   # split kernel vs combine vs cuDNN's kernels, us
echo "kern rc $? at $(( $(date +%s) - start )) s" >> $OUT/kern.log
P="$(python3 -c 'from attnfuse.passes import DEFAULT_PIPELINE as p; print(p.replace("split-kv", "split-kv{waves=1 min-blocks=1}"))')"
timeout $(( 540 - ($(date +%s) - start) )) python3 bench/decode.py --out $OUT/paged11 --graphs --sq 1 --batches 16,64 \
  --kv 1024,2048,4096 --no-flex --no-baseline-pipeline --pipeline "$P" > $OUT/paged11.log 2>&1
echo "paged11 rc $? at $(( $(date +%s) - start )) s" >> $OUT/paged11.log
