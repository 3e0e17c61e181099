#!/bin/sh
# vae.sh: our Wan2.1 VAE encode (bench/bench_vae, the `wanvae` plugin made through the core as
# `gh200core prepare` makes it) beside diffusers 0.42.1's AutoencoderKLWan in bf16
# (bench/vae_ref.py), on the same random full-size weights (base_dim 96, z 16, written once as
# bf16 safetensors under the official / ComfyUI names) and the same random clip (81 x 480 x 832 by
# default). Prints both encode times (the best of --iters after a warm-up), their memory peaks
# (ours: the device pool's high-water mark and the card's use by the process; diffusers:
# torch.cuda.max_memory_allocated and max_memory_reserved), ours / diffusers, and the max abs and
# relative difference of the two normalised latents. Each side runs in its own process.
# Run from a build tree, as tests/gpu-suite.sh (bench_vae built by `make bench`, the plugins in
# $top/plugins/.libs, packed libraries in $top/.device/lib); diffusers comes from the wheels in
# .whl/ (VAE_WHL names the folder; default: the first .whl/ of $top, its parent, its grandparent,
# the working directory), torch from the machine.
#
#   sh bench/vae.sh [--frames 81] [--height 480] [--width 832] [--iters 3] [--device 0]
#                   [--dtype bf16|f32] [--conv auto|own] [--tile N] [--no-ref] [--any-version]
#
# --dtype: our activations (diffusers always runs bf16); --conv own keeps our convolution
# (default: cuDNN's where libcudnn.so.9 loads); --tile N tiles both sides spatially (tiles of N
# pixels every 3/4 N: our `tile` key, diffusers' enable_tiling); --no-ref runs ours alone. Files and logs go to
# $OUT (or $top/vae-out). Exit status 0, 1 (a run failed) or 2 (setup: a missing binary, the
# pinned versions, an argument).
top=$(cd "$(dirname "$0")/.." && pwd)
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$top/vae-out}
frames=81 height=480 width=832 iters=3 device=0 dtype=bf16 conv=auto tile=0 ref=1 anyv=''
while [ $# -gt 0 ]; do
    case $1 in
    --frames) frames=$2; shift ;;
    --height) height=$2; shift ;;
    --width) width=$2; shift ;;
    --iters) iters=$2; shift ;;
    --device) device=$2; shift ;;
    --dtype) dtype=$2; shift ;;
    --conv) conv=$2; shift ;;
    --tile) tile=$2; shift ;;
    --no-ref) ref=0 ;;
    --any-version) anyv=--any-version ;;
    *) echo "vae.sh: unknown argument $1 (see the head of bench/vae.sh)" >&2; exit 2 ;;
    esac
    shift
done
mkdir -p "$out"
work=$(mktemp -d /tmp/ghc-vae.XXXXXX)
trap 'rm -rf "$work"' EXIT
export LD_LIBRARY_PATH="$top/.device/lib:$top/.libs:$top/kernels/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export GHC_BUILD_PLUGINS="$top/plugins/.libs"
bin="$top/bench/.libs/bench_vae"
[ -x "$bin" ] || bin="$top/bench/bench_vae"
[ -x "$bin" ] || { echo "vae.sh: $top/bench/bench_vae is not built (make bench)" >&2; exit 2; }
names="$top/tests/fixtures/wanvae/names_wan21.txt"
[ -f "$names" ] || names="$here/../tests/fixtures/wanvae/names_wan21.txt"
# plugins load only from folders no other user can write (doc/config.md)
[ "$(id -u)" = 0 ] && chown -R 0:0 "$top/plugins/.libs"
chmod -R go-w "$top/plugins/.libs"
# cuDNN (our convolution's fast path): the library PyTorch ships where the machine has none
if ! ldconfig -p 2>/dev/null | grep -q 'libcudnn.so.9 '; then
    for d in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
        f=$(find "$d/nvidia" -name 'libcudnn.so.9' 2>/dev/null | head -n 1)
        [ -n "$f" ] && { LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$f")"; echo "cuDNN: $f"; break; }
    done
fi
# diffusers (and its pure-Python dependencies) from the wheels
for w in "${VAE_WHL:-}" "$top/.whl" "$top/../.whl" "$top/../../.whl" "$PWD/.whl"; do
    [ -n "$w" ] && ls "$w"/*.whl > /dev/null 2>&1 || continue
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$work/site" "$w"/*.whl \
        > "$out/pip.log" 2>&1 || { echo "vae.sh: pip install from $w failed:"; tail -n 5 "$out/pip.log"; }
    export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}"
    echo "wheels: $(cd "$w" && ls ./*.whl | tr '\n' ' ')(from $w)"
    break
done
command -v nvidia-smi > /dev/null 2>&1 &&
    nvidia-smi -i "$device" --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"

# ---- the weights and the clip ----
echo "vae.sh: random Wan2.1 VAE and a clip of $frames x $height x $width"
python3 "$here/vae_ref.py" make $anyv --names "$names" --weights "$work/vae.safetensors" --video "$work/video.safetensors" \
    --frames "$frames" --height "$height" --width "$width" || exit 2

# ---- ours, then diffusers ----
status=0
"$bin" --weights "$work/vae.safetensors" --video "$work/video.safetensors" --out "$work/ours.safetensors" \
    --iters "$iters" --device "$device" --dtype "$dtype" --conv "$conv" --tile "$tile" 2>&1 | tee "$out/ours.log"
ours=$(grep '^RESULT ours' "$out/ours.log")
[ -n "$ours" ] || { echo "vae.sh: our encode failed (log: $out/ours.log)"; status=1; }
theirs='' diff=''
if [ "$ref" = 1 ]; then
    python3 "$here/vae_ref.py" run $anyv --names "$names" --weights "$work/vae.safetensors" \
        --video "$work/video.safetensors" --latent "$work/ref.safetensors" --iters "$iters" --device "$device" \
        --tile "$tile" 2>&1 | tee "$out/ref.log"
    theirs=$(grep '^RESULT ref' "$out/ref.log")
    [ -n "$theirs" ] || { echo "vae.sh: the diffusers encode failed (log: $out/ref.log)"; status=1; }
    if [ -n "$ours" ] && [ -n "$theirs" ]; then
        diff=$(python3 "$here/vae_ref.py" compare "$work/ours.safetensors" "$work/ref.safetensors" | grep '^RESULT diff')
    fi
fi

# ---- the table ----
val() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
{
    echo "Wan2.1 VAE encode, $frames x $height x $width, random weights (bf16 values)$([ "$tile" != 0 ] && echo ", tiles of $tile")"
    printf '%-28s %10s %14s %14s\n' "" "best s" "peak GiB" "card GiB"
    [ -n "$ours" ] && printf '%-28s %10s %14s %14s\n' "ours ($dtype, conv $(val "$ours" conv))" "$(val "$ours" time_s)" \
        "$(val "$ours" pool_peak_gib)" "$(val "$ours" card_gib)"
    [ -n "$theirs" ] && printf '%-28s %10s %14s %14s\n' "diffusers 0.42.1 (bf16)" "$(val "$theirs" time_s)" \
        "$(val "$theirs" peak_gib)" "$(val "$theirs" reserved_gib)"
    if [ -n "$ours" ] && [ -n "$theirs" ]; then
        awk -v a="$(val "$ours" time_s)" -v b="$(val "$theirs" time_s)" -v c="$(val "$ours" pool_peak_gib)" \
            -v d="$(val "$theirs" peak_gib)" \
            'BEGIN { printf "ours / diffusers: time %.2f, peak %.2f\n", a / b, c / d }'
    fi
    [ -n "$diff" ] && echo "latents: max abs diff $(val "$diff" max_abs), max rel (over max |ref|) $(val "$diff" max_rel), relative error norm $(val "$diff" rel_norm)"
    echo "(ours: clip from the host and latent back, in the time; pool peak = cudaMemPoolAttrUsedMemHigh, card = cudaMemGetInfo use; diffusers: clip already on the GPU, peak = max_memory_allocated, card = max_memory_reserved)"
} | tee "$out/vae.md"
exit $status
