#!/bin/sh
# gpu-suite.sh: run the GPU test suites and the benchmarks from a build tree, outside make
# (the GPU machine has no autotools). Built here with `make && make check TESTS= && make bench`,
# the shared libraries the GPU machine lacks packed into .device/lib by
# ../shared/tools/device-pack.sh. Logs go to $OUT (or ./gpu-out). Exit status: the number of
# failed suites.
top=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$top/gpu-out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$top/.device/lib:$top/.libs:$top/kernels/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export GHC_BUILD_PLUGINS="$top/plugins/.libs" GHC_TEST_PLUGINS="$top/tests/plugins/.libs"
export GHC_TEST_BADPLUGINS="$top/tests/badplugins/.libs" GHC_TEST_DATA="$top/tests/data"
export GHC_TOP_SRCDIR="$top" GHC_TOP_BUILDDIR="$top" GHC_CLI="$top/.libs/gh200core" GHC_PLUGIN_PATH=
export CK_FORK=no
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
failed=0
for t in test_cuda_device test_ops_cuda test_gemm_attn_cuda test_wan22 test_tensor test_ops_cpu test_safetensors test_loader test_config; do
    bin="$top/tests/.libs/$t"
    [ -x "$bin" ] || bin="$top/tests/$t"
    start=$(date +%s)
    "$bin" > "$out/$t.log" 2>&1
    rc=$?
    echo "$t: exit $rc ($(( $(date +%s) - start )) s) $(grep -E '^[0-9]+%: Checks' "$out/$t.log")"
    [ $rc -eq 0 ] || { failed=$((failed + 1)); grep -E ':[FE]:' "$out/$t.log" | head -n 20; }
done
if [ "${GHC_BENCH:-1}" = 1 ]; then
    bench="$top/bench/.libs/bench_ops"
    [ -x "$bench" ] || bench="$top/bench/bench_ops"
    "$bench" --csv "$out/bench_ops.csv" > "$out/bench_ops.log" 2>&1; echo "bench_ops: exit $?"; cat "$out/bench_ops.log"
    if python3 -c 'import torch' 2>/dev/null; then
        python3 "$top/bench/bench_torch.py" --ours "$out/bench_ops.csv" --csv "$out/bench_torch.csv" > "$out/bench_torch.log" 2>&1
        echo "bench_torch: exit $?"; cat "$out/bench_torch.log"
    fi
fi
exit $failed
