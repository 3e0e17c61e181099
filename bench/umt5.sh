#!/bin/sh
# umt5.sh: our umT5-XXL text encoder (bench/bench_umt5: plugins/umt5 on the GPU, bf16) beside
# transformers' UMT5EncoderModel in bf16 (bench/umt5_ref.py) on the same random weights and the
# same batch of prompts: umt5_ref.py draws the weights and writes them as safetensors in
# transformers' names, times PyTorch and keeps its outputs (bf16, and the f32 forward as the
# accuracy reference); bench_umt5 loads that file, times ours; then both times, peaks, the ratio
# and the max abs / relative differences are printed. Run from a CUDA build tree on the GPU machine,
# as tests/gpu-suite.sh (libraries in .device/lib, plugins in plugins/.libs of the tree, or of the
# working directory for an out-of-tree build; build bench_umt5 first with `make bench`).
#
#   sh bench/umt5.sh [--batch 8] [--len 512] [--layers 24] [--iters 5] [--warmup 2] [--device N]
#                    [--vocab 256384] [--keep] [--any-version]
#
# transformers 5.24.0 (pinned; the GPU machine's own is older) is installed from the wheels in
# .whl/ (UMT5_WHL, else the first .whl/ of $top, its parent, its grandparent, the working
# directory) into a folder of its own. Files (the weights are 11.4 GB at full size) go to a
# temporary folder, removed at the end unless --keep; the results (torch.txt, ours.txt, the table
# umt5.txt) to $OUT (or $top/umt5-out). --device -1 --len 32 --layers 1 --vocab 1000 checks the
# scripts on a CPU (slowly; umt5_ref.py then runs with --device cpu). Exit status 0, 1 when a
# side fails, 2 for bad arguments.
top=$(cd "$(dirname "$0")/.." && pwd)
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$top/umt5-out}
batch=8 len=512 layers=24 iters=5 warmup=2 device=0 vocab=256384 keep=0 anyv=''
while [ $# -gt 0 ]; do
    case $1 in
    --batch) batch=$2; shift ;;
    --len) len=$2; shift ;;
    --layers) layers=$2; shift ;;
    --iters) iters=$2; shift ;;
    --warmup) warmup=$2; shift ;;
    --device) device=$2; shift ;;
    --vocab) vocab=$2; shift ;;
    --keep) keep=1 ;;
    --any-version) anyv=--any-version ;;
    -h|--help) sed -n '2,/^top=/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "umt5.sh: unknown argument '$1' (--help)" >&2; exit 2 ;;
    esac
    shift
done
# the build: this tree (built in place), else the working directory (an out-of-tree build)
build=$top
[ -e "$build/bench/bench_umt5" ] || build=$PWD
bin="$build/bench/.libs/bench_umt5"
[ -x "$bin" ] || bin="$build/bench/bench_umt5"
[ -x "$bin" ] || { echo "umt5.sh: bench/bench_umt5 is not built in $top or $PWD (make bench in a CUDA build)" >&2
                   exit 2; }
mkdir -p "$out"
work=$(mktemp -d "${TMPDIR:-/tmp}/ghc-umt5.XXXXXX")
[ $keep = 1 ] || trap 'rm -rf "$work"' EXIT
export LD_LIBRARY_PATH="$build/.device/lib:$build/.libs:$build/kernels/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export GHC_PLUGIN_PATH="$build/plugins/.libs"
# plugins load only from folders no other user can write (doc/config.md)
chmod -R go-w "$build/plugins/.libs" 2>/dev/null

# ---- transformers: from the wheels in .whl/ ----
for w in "${UMT5_WHL:-}" "$top/.whl" "$top/../.whl" "$top/../../.whl" "$PWD/.whl"; do
    [ -n "$w" ] && ls "$w"/transformers-*.whl > /dev/null 2>&1 || continue
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$work/site" "$w"/*.whl \
        > "$out/pip.log" 2>&1 || { echo "umt5.sh: pip install from $w failed:"; tail -n 5 "$out/pip.log"; }
    export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}"
    echo "wheels: $(cd "$w" && ls ./*.whl | tr '\n' ' ')(from $w)"
    break
done

pydev=cuda
[ "$device" -ge 0 ] 2>/dev/null && export CUDA_VISIBLE_DEVICES=$device && device=0 || pydev=cpu
echo "== transformers (bf16): $batch x $len, $layers layers"
python3 "$here/umt5_ref.py" make --dir "$work" --batch "$batch" --len "$len" --layers "$layers" --iters "$iters" \
    --warmup "$warmup" --vocab "$vocab" --device "$pydev" $anyv || exit 1
cp "$work/torch.txt" "$out/torch.txt"
echo "== ours (bf16)"
"$bin" --weights "$work/weights.safetensors" --inputs "$work/inputs.safetensors" --out "$work/ours.safetensors" \
    --dtype bf16 --device "$device" --iters "$iters" --warmup "$warmup" > "$work/ours.txt" || exit 1
cat "$work/ours.txt"
cp "$work/ours.txt" "$out/ours.txt"
echo "=="
python3 "$here/umt5_ref.py" compare --dir "$work" $anyv | tee "$out/umt5.txt"
