#!/bin/bash
# Session 33, call B: programmatic dependent launch of the split-KV combine: A/B, GPU tests, decode table.
python3 -c "import xdsl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench
start=$(date +%s)
run() { name=$1; shift; ATTNFUSE_CACHE_DIR=$(mktemp -d) timeout 80 python3 .gpu/s33_pdl.py --name $name --out $OUT/pdl.jsonl "$@" >> $OUT/pdl.log 2>&1; echo "$name at $(( $(date +%s) - start )) s" >> $OUT/pdl.log; }
run pdl --sdpa
run nopdl --nopdl
run pdl_lb8 --long-blocks 8 --batches 16 --kv 1024,8192
run nopdl_lb8 --nopdl --long-blocks 8 --batches 16 --kv 1024,8192
ATTNFUSE_CACHE_DIR=$(mktemp -d) timeout 200 python3 -m pytest -q -p no:cacheprovider --junitxml=$OUT/tests_decode.xml tests/gpu/test_split_kv_gpu.py tests/gpu/test_paged_gpu.py > $OUT/tests_decode.txt 2>&1
echo "tests at $(( $(date +%s) - start )) s" >> $OUT/pdl.log
left=$(( 555 - ($(date +%s) - start) ))
mkdir -p $OUT/dec
[ $left -gt 60 ] && ATTNFUSE_CACHE_DIR=$(mktemp -d) timeout $left python3 bench/decode.py --out $OUT/dec --batches 1,16,64 --kv 1024,8192,32768,131072 --sq 1,4 --graphs --no-flex --no-baseline-pipeline --page-size 16 > $OUT/dec.log 2>&1
echo "all done at $(( $(date +%s) - start )) s" >> $OUT/pdl.log
