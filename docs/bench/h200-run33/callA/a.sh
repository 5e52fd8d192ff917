#!/bin/bash
# Session 33, call A: GPU correctness of the decode kernels after LICM (ea91120) and 91a94b8; split-kernel pipeline depth.
python3 -c "import xdsl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench
start=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv > $OUT/gpu.txt 2>&1
ATTNFUSE_CACHE_DIR=$(mktemp -d) timeout 240 python3 -m pytest -q -p no:cacheprovider --junitxml=$OUT/tests_decode.xml tests/gpu/test_split_kv_gpu.py tests/gpu/test_paged_gpu.py > $OUT/tests_decode.txt 2>&1
echo "tests at $(( $(date +%s) - start )) s" >> $OUT/stages.log
run() { name=$1; shift; ATTNFUSE_CACHE_DIR=$(mktemp -d) timeout 80 python3 .gpu/s31_stages.py --name $name --out $OUT/stages.jsonl "$@" >> $OUT/stages.log 2>&1; echo "$name at $(( $(date +%s) - start )) s" >> $OUT/stages.log; }
run base --sdpa
run d5 --depth 5 --paged-depth 9
run d6 --depth 6 --paged-depth 11
run d5_pw1 --depth 5 --paged-depth 9 --paged-opts "{waves=1 min-blocks=1}"
left=$(( 550 - ($(date +%s) - start) ))
[ $left -gt 40 ] && ATTNFUSE_CACHE_DIR=$(mktemp -d) timeout $left python3 -m pytest -q -p no:cacheprovider --junitxml=$OUT/tests_varlen.xml tests/gpu/test_varlen_gpu.py tests/gpu/test_host_path_gpu.py > $OUT/tests_varlen.txt 2>&1
echo "all done at $(( $(date +%s) - start )) s" >> $OUT/stages.log
