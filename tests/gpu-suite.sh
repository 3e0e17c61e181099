#!/bin/sh
# gpu-suite.sh: run the GPU test suites, training runs on the GPU and the benchmarks from a
# build tree, outside make (the GPU machine has no autotools). Built here with
# `make && make check TESTS= && make bench`, the shared libraries the GPU machine lacks packed
# into .device/lib by ../shared/tools/device-pack.sh. Logs go to $OUT (or ./gpu-out).
# GHC_BENCH=0 skips the benchmarks (bench_optim, bench_lycoris, bench_mem; GHC_BENCHES names a
# subset, BENCH_LAYERS and BENCH_TOKENS size bench_mem); GHC_BENCH_OPS=1 adds bench_ops +
# bench_torch.py. GHC_SUITES names the suites, GHC_TRAIN=0 skips the demo runs, the resume and
# the mid-size run, GHC_SAVED=0 the saved-activation runs of the demo, GHC_DIST=0 (1) the runs on
# two GPUs (default: when the machine has two or more).
# Exit status: the number of failed parts.
top=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$top/gpu-out}
mkdir -p "$out"
work=$(mktemp -d /tmp/ghc-gpu.XXXXXX)
export LD_LIBRARY_PATH="$top/.device/lib:$top/.libs:$top/kernels/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export GHC_BUILD_PLUGINS="$top/plugins/.libs" GHC_TEST_PLUGINS="$top/tests/plugins/.libs"
# plugins load only from folders no other user can write (doc/config.md, allow_insecure_plugins):
# a tree copied to this machine may arrive group-writable or owned by another user
for d in "$top/plugins/.libs" "$top/tests/plugins/.libs" "$top/tests/badplugins/.libs" "$top/tests/diagplugins/.libs"; do
    [ -d "$d" ] || continue
    [ "$(id -u)" = 0 ] && chown -R 0:0 "$d"
    chmod -R go-w "$d"
done
export GHC_TEST_BADPLUGINS="$top/tests/badplugins/.libs" GHC_TEST_DATA="$top/tests/data"
export GHC_TOP_SRCDIR="$top" GHC_TOP_BUILDDIR="$top" GHC_CLI="$top/.libs/gh200core" GHC_PLUGIN_PATH=
export CK_FORK=no
# cuDNN (the attention's second path, loaded at run time): the library PyTorch ships, where the
# machine has no system cuDNN; GHC_CUDNN=0 leaves it out (our kernels alone)
if [ "${GHC_CUDNN:-1}" != 0 ] && ! ldconfig -p 2>/dev/null | grep -q 'libcudnn.so.9 '; then
    for d in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
        f=$(find "$d/nvidia" -name 'libcudnn.so.9' 2>/dev/null | head -n 1)
        [ -n "$f" ] && { LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$f")"; echo "cuDNN: $f"; break; }
    done
fi
# NCCL (several GPUs): likewise the library PyTorch ships
if ! ldconfig -p 2>/dev/null | grep -q 'libnccl.so.2 '; then
    for d in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
        f=$(find "$d/nvidia" -name 'libnccl.so.2' 2>/dev/null | head -n 1)
        [ -n "$f" ] && { LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$f")"; echo "NCCL: $f"; break; }
    done
fi
cli="$top/.libs/gh200core"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
failed=0
logs="$out/suites.log"
: > "$logs"

# ---- the suites ----
for t in ${GHC_SUITES:-test_cuda_device test_ops_cuda test_gemm_attn_cuda test_umt5_cuda test_vae_cuda test_wan22 test_optim_cuda test_lycoris_cuda \
         test_data_cuda test_mem_cuda test_optim test_lycoris test_data test_mem test_tensor test_ops_cpu}; do
    bin="$top/tests/.libs/$t"
    [ -x "$bin" ] || bin="$top/tests/$t"
    [ -x "$bin" ] || { echo "$t: not built"; continue; }
    start=$(date +%s)
    echo "==== $t" >> "$logs"
    timeout 200 "$bin" > "$work/$t.log" 2>&1
    rc=$?
    cat "$work/$t.log" >> "$logs"
    echo "$t: exit $rc ($(( $(date +%s) - start )) s) $(grep -E '^[0-9]+%: Checks' "$work/$t.log")"
    [ $rc -eq 0 ] || { failed=$((failed + 1)); grep -E ':[FE]:' "$work/$t.log" | head -n 20; }
done

# ---- training on the GPU: the tiny demo under three memory policies, and a resume ----
train() {   # name, then --set arguments ($NP: that many ranks, gh200core --nproc)
    n=$1; shift
    # shellcheck disable=SC2086
    GHC_PLUGIN_PATH="$top/plugins/.libs" timeout 150 "$cli" ${NP:+--nproc $NP} -q -c "$top/etc/tiny.cfg" --set output_dir="\"$work/$n\"" \
        --set model.device=0 --set train.steps=40 --set scheduler.decay_steps=40 --set train.log_every=40 "$@" \
        > "$work/train_$n.log" 2>&1
    rc=$?
    echo "train $n: exit $rc"
    [ $rc -eq 0 ] || { failed=$((failed + 1)); tail -n 5 "$work/train_$n.log"; }
}
losses() { grep -o '"loss":[^,]*' "$1/metrics.jsonl" | cut -d: -f2; }
cmp_losses() {   # a b [first-line]: the largest relative difference of the losses (below 1e-3)
    losses "$work/$1" | tail -n +"${3:-1}" > "$work/l1"
    losses "$work/$2" > "$work/l2"
    paste "$work/l1" "$work/l2" | awk -v a="$1" -v b="$2" '{ d = $1 - $2; if (d < 0) d = -d; r = d / ($1 > 0 ? $1 : 1);
        if (r > m) m = r; if ($1 != $2) ne++; n++ }
        END { printf "losses %s vs %s: %d steps, %d differ, max relative difference %.3g\n", a, b, n, ne, m; exit !(n > 0 && m < 1e-3) }'
    [ $? -eq 0 ] || failed=$((failed + 1))
}
cmp_exact() {   # a b: the same losses bit for bit (as printed, %.9g)
    losses "$work/$1" > "$work/l1"
    losses "$work/$2" > "$work/l2"
    if [ -s "$work/l1" ] && cmp -s "$work/l1" "$work/l2"; then
        echo "losses $1 vs $2: $(wc -l < "$work/l1") steps, identical"
    else
        echo "losses $1 vs $2: DIFFER ($(paste "$work/l1" "$work/l2" | awk '$1 != $2' | wc -l) of $(wc -l < "$work/l1") steps)"
        failed=$((failed + 1))
    fi
}
if [ "${GHC_TRAIN:-1}" = 1 ]; then
    train device --set mempolicy.plugin='"device"'
    train uvm --set mempolicy.plugin='"gh200_uvm"'
    train offload --set mempolicy.plugin='"offload"'
    echo "first and last losses (device): $(losses "$work/device" | head -n 1) ... $(losses "$work/device" | tail -n 1)"
    cmp_losses device uvm
    cmp_losses device offload
    train device2 --set mempolicy.plugin='"device"'
    cmp_losses device device2
    # resume: 40 steps with a checkpoint at 20, then 20 more from that checkpoint elsewhere
    train resa --set mempolicy.plugin='"device"' --set train.save_every=20 --set train.keep_last=0
    train resb --set mempolicy.plugin='"device"' --resume "$work/resa/checkpoint-20"
    cmp_losses resa resb 21
    # a mid-size model (4 blocks of dim 1536, 2048 tokens, 512 text rows of 4096; the latent-only
    # demo, whose shapes are set here): s/step and the share of the step spent waiting for data
    GHC_PLUGIN_PATH="$top/plugins/.libs" timeout 240 "$cli" -q -c "$top/etc/tiny.cfg" --set output_dir="\"$work/mid\"" \
        --set model.device=0 --set model.dtype='"bf16"' --set model.checkpointing='"block"' \
        --set mempolicy.plugin='"device"' --set train.steps=12 --set scheduler.decay_steps=12 \
        --set model.random.dim=1536 --set model.random.ffn_dim=8960 --set model.random.heads=12 \
        --set model.random.layers=4 --set model.random.text_dim=4096 --set model.random.freq_dim=256 \
        --set demo.videos=0 --set demo.images=0 --set demo.samples=4 --set demo.height=32 --set demo.width=32 --set demo.frames=8 \
        --set demo.text_len=512 --set demo.text_dim=4096 --set data.batch_size=1 --set network.rank=16 \
        --set cache.plugin='"unified_memory"' --set train.sync_timing=true --set train.profile_steps=4 \
        > "$work/train_mid.log" 2>&1
    echo "train mid: exit $?"; tail -n 3 "$work/train_mid.log"
    # train.profile_steps: steps 2..5 profiled through CUPTI into profile.md
    if grep -q "the GPU busy" "$work/mid/profile.md" 2>/dev/null && grep -q "matrix products" "$work/mid/profile.md"; then
        echo "profile of the mid-size run (train.profile_steps = 4):"; head -n 14 "$work/mid/profile.md"
    else
        echo "profile: no $work/mid/profile.md with the GPU's time"; grep -i profile "$work/train_mid.log"
        failed=$((failed + 1))
    fi
    [ -f "$work/mid/metrics.jsonl" ] && tail -n +3 "$work/mid/metrics.jsonl" | awk -F'[:,]' '
        { for (i = 1; i < NF; i++) { if ($i == "\"time_step\"") s += $(i+1); if ($i == "\"time_data\"") d += $(i+1) } n++ }
        END { if (n) printf "mid-size steps 3..%d: %.4f s/step, data wait %.5f s/step = %.3f%% of the step\n", n + 2, s / n, d / n, 100 * d / s }'
fi

# ---- saved activations (issue 23): the demo with checkpointing "block", the block inputs on
# the card (device) or pinned on the host through the saved ring (offload, gh200_uvm), and
# "block_attn" (the attention output kept, not recomputed): the same losses bit for bit; and
# "block_qkv" (q, k and v kept too; q's and k's rounded to bf16 before their norms: its own
# bits) under the three policies alike ----
if [ "${GHC_SAVED:-1}" = 1 ]; then
    for c in block block_attn block_qkv; do
        for p in device offload gh200_uvm; do
            train "s_${p}_$c" --set mempolicy.plugin="\"$p\"" --set model.checkpointing="\"$c\""
        done
    done
    for r in s_offload_block s_gh200_uvm_block s_device_block_attn s_offload_block_attn s_gh200_uvm_block_attn; do
        cmp_exact s_device_block "$r"
    done
    for r in s_offload_block_qkv s_gh200_uvm_block_qkv; do
        cmp_exact s_device_block_qkv "$r"
    done
fi

# ---- two GPUs (issue 25): the demo on 2 ranks (gh200core --nproc 2, NCCL) as on one GPU with
# the same global batch (2 micro-batches of 2 samples), the adapters the same on both ranks (the
# run's own check, at the checkpoint and the end), and a rank killed mid-run ending the other
# with a line instead of a hang ----
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "${GHC_DIST:-auto}" = 1 ] || { [ "${GHC_DIST:-auto}" = auto ] && [ "$ngpu" -ge 2 ]; }; then
    dp="--set mempolicy.plugin=\"device\" --set scheduler.micro_batches=2 --set data.batch_size=2 --set train.save_every=20"
    # shellcheck disable=SC2086
    train dp1 $dp
    # shellcheck disable=SC2086
    NP=2 train dp2 $dp -v   # -v after -q: the info lines, the adapter checks among them
    cmp_losses dp1 dp2
    for s in 20 40; do
        if grep -q "dist: the adapters are the same on all 2 ranks after step $s" "$work/train_dp2.log"; then
            echo "dp2: adapters the same on both ranks after step $s"
        else
            echo "dp2: no adapter check after step $s"; failed=$((failed + 1))
        fi
    done
    # a rank killed mid-run: the launcher returns within the grace period, the others say why
    GHC_PLUGIN_PATH="$top/plugins/.libs" "$cli" --nproc 2 -c "$top/etc/tiny.cfg" --set output_dir="\"$work/dpk\"" \
        --set model.device=0 --set mempolicy.plugin='"device"' --set train.steps=100000 > "$work/train_dpk.log" 2>&1 &
    launcher=$!
    i=0
    while [ $i -lt 600 ] && [ "$(cat "$work/dpk/metrics.jsonl" 2>/dev/null | wc -l)" -lt 3 ]; do sleep 0.1; i=$((i + 1)); done
    r1=$(cut -d' ' -f2 "/proc/$launcher/task/$launcher/children" 2>/dev/null)
    start=$(date +%s)
    [ -n "$r1" ] && kill -9 "$r1"
    i=0
    while kill -0 "$launcher" 2>/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
    if kill -0 "$launcher" 2>/dev/null; then
        echo "dpk: the launcher still runs 30 s after rank 1 was killed (a hang)"; failed=$((failed + 1))
        kill -9 "$launcher"
    elif grep -q "closed its connection" "$work/train_dpk.log"; then
        echo "dpk: rank 1 killed; the run ended after $(( $(date +%s) - start )) s: $(grep 'closed its connection' "$work/train_dpk.log" | head -n 1)"
    else
        echo "dpk: rank 1 killed, but no line says so"; tail -n 5 "$work/train_dpk.log"; failed=$((failed + 1))
    fi
    wait "$launcher" 2>/dev/null
fi

# ---- diag and the benchmarks ----
GHC_PLUGIN_PATH="$top/plugins/.libs" timeout 60 "$cli" diag --json "$out/diag.json" --oversubscription-scale 0.25 \
    > "$work/diag.log" 2>&1
echo "diag: exit $?"; grep -iE "platform|fail|GB/s" "$work/diag.log" | head -n 20
if [ "${GHC_BENCH:-1}" = 1 ]; then
    b="$out/bench.log"
    benches=" ${GHC_BENCHES:-bench_optim bench_lycoris bench_mem} "
    for t in bench_optim; do
        [ -x "$top/bench/.libs/$t" ] && [ "${benches#* $t }" != "$benches" ] || continue
        timeout 120 "$top/bench/.libs/$t" > "$work/$t.log" 2>&1; echo "$t: exit $?"; cat "$work/$t.log" | tee -a "$b"
    done
    if [ -x "$top/bench/.libs/bench_lycoris" ] && [ "${benches#* bench_lycoris }" != "$benches" ]; then
        timeout 300 "$top/bench/.libs/bench_lycoris" --iters "${BENCH_LYC_ITERS:-9}" > "$work/bench_lycoris.log" 2>&1
        echo "bench_lycoris: exit $?"; cat "$work/bench_lycoris.log" | tee -a "$b"
    fi
    if [ -x "$top/bench/.libs/bench_mem" ] && [ "${benches#* bench_mem }" != "$benches" ]; then
        timeout "${BENCH_MEM_T:-240}" "$top/bench/.libs/bench_mem" --layers "${BENCH_LAYERS:-4}" \
            --tokens "${BENCH_TOKENS:-32760}" --reps 2 --csv "$out/bench_mem.csv" > "$work/bench_mem.log" 2>&1
        echo "bench_mem: exit $?"; cat "$work/bench_mem.log" | tee -a "$b"
    fi
    if [ "${GHC_BENCH_OPS:-0}" = 1 ]; then
        "$top/bench/.libs/bench_ops" --csv "$out/bench_ops.csv" > "$work/bench_ops.log" 2>&1
        echo "bench_ops: exit $?"; cat "$work/bench_ops.log" | tee -a "$b"
        if python3 -c 'import torch' 2>/dev/null; then
            python3 "$top/bench/bench_torch.py" --ours "$out/bench_ops.csv" --csv "$out/bench_torch.csv" > "$work/bench_torch.log" 2>&1
            echo "bench_torch: exit $?"; cat "$work/bench_torch.log" | tee -a "$b"
        fi
    fi
fi
cp "$work"/train_*.log "$work/diag.log" "$out/" 2>/dev/null
tar -C "$work" -czf "$out/runs.tgz" --exclude='*.safetensors' . 2>/dev/null
rm -rf "$work"
echo "failed parts: $failed"
exit $failed
