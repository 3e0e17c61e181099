#!/bin/sh
# prepare.sh: `gh200core prepare` of N clips (100 by default) through the real CLI, with the
# full-size Wan2.1 VAE (base_dim 96, 2 res blocks, z 16) and umT5-XXL (d_model 4096, 24 layers,
# 64 heads of 64, d_ff 10240; ids the captions' bytes) at random weights, into a bucket of
# --width x --height x --frames (832 x 480 x 81), and whether the run was limited by the GPU (the
# encoders) or by decoding: prepare's last line says how long the encoding thread spent encoding
# and how long it waited for the files read ahead (doc/prepare.md, "Decoding beside encoding").
# The N dataset entries are the source clips of --src (K of them, used in turn) hard-linked (or
# copied) under N names with N captions: each is its own sample, decoded and encoded.
# Run from a build tree, as bench/vae.sh (the CLI at $top/.libs/gh200core, the plugins at
# $top/plugins/.libs, packed libraries in $top/.device/lib; for an out-of-tree build, from the
# build folder: the working directory's); bench/README.md has the commands.
#
#   sh bench/prepare.sh --src DIR [--clips 100] [--width 832] [--height 480] [--frames 81]
#                       [--device 0] [--ahead N] [--vae-base 96] [--vae-blocks 2]
#                       [--text-layers 24] [--text-dims DMODEL:HEADS:DKV:DFF] [--ffmpeg-lib DIR]
#                       [--timeout S] [--keep]
#   sh bench/prepare.sh --make-src DIR [--src-count 10]   (here, with Debian's ffmpeg CLI)
#   sh bench/prepare.sh --tiny                            (a check of the script on the CPU)
#
# --src: a folder of source clips (*.mp4 *.mkv *.webm *.mov); --device: the CUDA ordinal of
# both encoders (-1: the CPU, with tiny encoders unless sizes are given); --ahead: files read
# ahead (GHC_PREPARE_AHEAD; prepare's default is half the processors, 2 to 8); --vae-base,
# --vae-blocks: the VAE's random.base_dim and num_res_blocks; --text-layers / --text-dims: the
# umT5's (the full size's weights take 9 GB in bf16 and some seconds to draw);
# --ffmpeg-lib: a folder of FFmpeg's libraries put first in LD_LIBRARY_PATH (bench/ffmpeg_min.sh's
# lib/, for a machine without FFmpeg). --make-src writes K source clips of 81 frames of 1280 x 720
# at 16 fps, H.264 in mp4 (a moving test pattern with noise, about 400 KB each) to DIR and stops.
# --tiny makes 4 small clips (ffmpeg's CLI), 8 entries of a 64 x 48 x 9 bucket, tiny random
# encoders on the CPU. The table: the clips, the CLI's wall time, (encoding + waiting) per clip,
# the last line's times, and the verdict: "limited by decoding" when the encoding thread waited
# for decoding more than 10% of (encoding + waiting), else "limited by the GPU (encoders)". The
# log (prepare.log), the configuration and the table (prepare.md) go to $OUT (or
# $top/prepare-out); the dataset to a temporary folder (removed unless --keep).
# Exit status 0, 1 (prepare failed), 2 (setup: an argument, no CLI, no clips).
top=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$top/prepare-out}
clips=100 src='' width=832 height=480 frames=81 device='' ahead='' vae_base='' vae_blocks='' text_layers=''
text_dims='' fflib='' tlimit=3600 keep=0 make_src='' src_count=10 tiny=0
while [ $# -gt 0 ]; do
    case $1 in
    --clips) clips=$2; shift ;;
    --src) src=$2; shift ;;
    --width) width=$2; shift ;;
    --height) height=$2; shift ;;
    --frames) frames=$2; shift ;;
    --device) device=$2; shift ;;
    --ahead) ahead=$2; shift ;;
    --vae-base) vae_base=$2; shift ;;
    --vae-blocks) vae_blocks=$2; shift ;;
    --text-layers) text_layers=$2; shift ;;
    --text-dims) text_dims=$2; shift ;;
    --ffmpeg-lib) fflib=$2; shift ;;
    --timeout) tlimit=$2; shift ;;
    --keep) keep=1 ;;
    --make-src) make_src=$2; shift ;;
    --src-count) src_count=$2; shift ;;
    --tiny) tiny=1 ;;
    -h|--help) sed -n '2,/^top=/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "prepare.sh: unknown argument '$1' (--help)" >&2; exit 2 ;;
    esac
    shift
done
for v in "$clips" "$width" "$height" "$frames" "$src_count" "$tlimit" ${ahead:+"$ahead"} ${device:+"${device#-}"}; do
    case $v in ''|*[!0-9]*) echo "prepare.sh: '$v' is not a whole number (--help)" >&2; exit 2 ;; esac
done
[ $(((frames - 1) % 4)) = 0 ] || { echo "prepare.sh: --frames $frames: 4k + 1 frames are expected" >&2; exit 2; }

# K source clips of FRAMES frames of W x H at 16 fps, H.264 in mp4: testsrc2 (moving), each
# clip's hue turned and its noise seeded apart, so that they neither match nor compress to nothing
make_clips() {   # dir count w h frames
    command -v ffmpeg > /dev/null 2>&1 || { echo "prepare.sh: no ffmpeg CLI here (apt-get install ffmpeg)" >&2; return 2; }
    mkdir -p "$1" || return 2
    k=0
    while [ $k -lt "$2" ]; do
        f=$(printf '%s/src%02d.mp4' "$1" $k)
        ffmpeg -nostdin -loglevel error -y -f lavfi -i "testsrc2=size=$3x$4:rate=16" -frames:v "$5" \
            -vf "hue=h=$((k * 37)),noise=alls=10:allf=t+u:all_seed=$((k + 1))" -c:v libx264 -preset medium \
            -b:v "$(($3 * $4 / 1440))k" -pix_fmt yuv420p -movflags +faststart "$f" ||
            { echo "prepare.sh: ffmpeg failed on $f" >&2; return 1; }
        k=$((k + 1))
    done
    echo "prepare.sh: $2 clips of $5 x $3 x $4 in $1, $(du -sk "$1" | cut -f1) KiB"
}
if [ -n "$make_src" ]; then
    make_clips "$make_src" "$src_count" 1280 720 81
    exit $?
fi

work=$(mktemp -d /tmp/ghc-prep.XXXXXX)
if [ $keep = 1 ]; then echo "prepare.sh: the dataset stays in $work"; else trap 'rm -rf "$work"' EXIT; fi
trap 'exit 130' INT TERM
if [ $tiny = 1 ]; then
    clips=8 width=64 height=48 frames=9
    device=${device:--1}
    if [ -z "$src" ]; then src="$work/src"; make_clips "$src" 4 96 64 9 || exit 2; fi
fi
device=${device:-0}
# sizes: full on a GPU, tiny (the plugins' defaults) on the CPU unless given
if [ "$device" -ge 0 ] || [ -n "$vae_base$vae_blocks" ]; then vae_base=${vae_base:-96} vae_blocks=${vae_blocks:-2}; fi
if [ "$device" -ge 0 ] || [ -n "$text_layers$text_dims" ]; then
    text_layers=${text_layers:-24} text_dims=${text_dims:-4096:64:64:10240}
fi
[ -n "$src" ] && [ -d "$src" ] || { echo "prepare.sh: no source folder (--src DIR, or --make-src DIR first)" >&2; exit 2; }
srcs=$(cd "$src" && ls ./*.mp4 ./*.mkv ./*.webm ./*.mov 2>/dev/null | sed 's|^\./||')
nsrc=$(echo "$srcs" | grep -c .)
[ "$nsrc" -gt 0 ] || { echo "prepare.sh: no clips (*.mp4 *.mkv *.webm *.mov) in $src" >&2; exit 2; }
src=$(cd "$src" && pwd)

mkdir -p "$out"
# the build: the tree of this script, else (an out-of-tree build) the working directory
bld=$top
[ -x "$bld/.libs/gh200core" ] || [ -x "$bld/gh200core" ] || bld=$PWD
export LD_LIBRARY_PATH="$bld/.device/lib:$bld/.libs:$bld/kernels/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
[ -n "$fflib" ] && { fflib=$(cd "$fflib" && pwd) || exit 2; LD_LIBRARY_PATH="$fflib:$LD_LIBRARY_PATH"; }
export GHC_PLUGIN_PATH="$bld/plugins/.libs"
# plugins load only from folders no other user can write: a tree copied here may arrive otherwise
[ -d "$GHC_PLUGIN_PATH" ] && { [ "$(id -u)" = 0 ] && chown -R 0:0 "$GHC_PLUGIN_PATH"; chmod -R go-w "$GHC_PLUGIN_PATH"; }
cli="$bld/.libs/gh200core"
[ -x "$cli" ] || cli="$bld/gh200core"
[ -x "$cli" ] || { echo "prepare.sh: no CLI at $top/.libs/gh200core nor $PWD/.libs/gh200core (build first)" >&2; exit 2; }
# which FFmpeg the CLI's libraries load (the library that decodes: libgh200core_train)
train=$(ldd "$cli" 2>/dev/null | awk '$1 ~ /^libgh200core_train/ { print $3 }')
avcodec=$(ldd "${train:-$cli}" 2>/dev/null | awk '$1 ~ /^libavcodec/ { print $3 }')
case $avcodec in
'') echo "prepare.sh: $cli has no FFmpeg (a build configured --without-ffmpeg)" >&2; exit 2 ;;
/*) ;;
*) echo "prepare.sh: the CLI's libraries do not find libavcodec.so.59 (--ffmpeg-lib DIR)" >&2; exit 2 ;;
esac
if [ "$device" -ge 0 ] && command -v nvidia-smi > /dev/null 2>&1; then
    nvidia-smi -i "$device" --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
fi

# ---- the dataset: N entries from the K clips, each its own name and caption ----
mkdir -p "$work/clips"
i=0
while [ $i -lt "$clips" ]; do
    s=$(echo "$srcs" | sed -n "$((i % nsrc + 1))p")
    e=$(printf 'clip%03d.%s' $i "${s##*.}")
    ln "$src/$s" "$work/clips/$e" 2> /dev/null || cp "$src/$s" "$work/clips/$e" || exit 2
    printf 'clip %d of %d, a moving test pattern (%s), take %d\n' $i "$clips" "$s" $((i / nsrc)) \
        > "$work/clips/clip$(printf %03d $i).txt"
    i=$((i + 1))
done
policy=host
[ "$device" -ge 0 ] && policy=device
vae_random='version = 21;'
[ -n "$vae_base" ] && vae_random="$vae_random base_dim = $vae_base; num_res_blocks = $vae_blocks;"
te_random=''
if [ -n "$text_layers" ]; then
    IFS=: read -r d_model heads d_kv d_ff <<EOF
$text_dims
EOF
    te_random="d_model = $d_model; layers = $text_layers; heads = $heads; d_kv = $d_kv; d_ff = $d_ff;"
fi
cat > "$work/prepare.cfg" <<EOF
# bench/prepare.sh: $clips entries of $nsrc clips of $src
mempolicy = { plugin = "$policy"; };
vae = { plugin = "wanvae"; device = $device; random = { $vae_random }; };
text_encoder = { plugin = "umt5"; device = $device; random = { $te_random }; };
data = { datasets = ( { path = "clips"; resolution = [$width, $height]; target_frames = [$frames]; } ); };
EOF
cp "$work/prepare.cfg" "$out/prepare.cfg"
nproc=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN)
if [ -n "$ahead" ]; then export GHC_PREPARE_AHEAD=$ahead
else ahead=$((nproc / 2)); [ $ahead -lt 2 ] && ahead=2; [ $ahead -gt 8 ] && ahead=8; fi

# ---- the run ----
echo "prepare.sh: $clips clips ($nsrc sources) into $width x $height x $frames, device $device, $ahead read ahead" \
     "of $nproc processors; FFmpeg $avcodec"
t0=$(date +%s.%N)
(cd "$work" && timeout -k 30 "$tlimit" "$cli" prepare -c prepare.cfg) > "$out/prepare.log" 2>&1
rc=$?
t1=$(date +%s.%N)
grep -v '\] clip[0-9]*\..*: encoded in' "$out/prepare.log" | tail -n 5
last=$(grep 'prepare: .* media files: ' "$out/prepare.log" | tail -n 1)
if [ $rc != 0 ] || [ -z "$last" ]; then
    echo "prepare.sh: prepare failed (exit $rc; log: $out/prepare.log)" >&2
    exit 1
fi

# ---- the table ----
num() { echo "$last" | sed -n "s/.*$1 \([0-9.]*\).*/\1/p"; }
encoded=$(echo "$last" | sed -n 's/.* \([0-9]*\) encoded.*/\1/p')
total=$(num ', in') enc=$(num 'encoding') wait=$(num 'waiting for decoding') load=$(num 'loading the encoders')
{
    echo "gh200core prepare: $clips clips of $nsrc sources ($(echo "$srcs" | head -n 1), ...) into $width x $height x $frames"
    echo "VAE: Wan2.1 random (base_dim ${vae_base:-8}, num_res_blocks ${vae_blocks:-1}); umT5 random" \
         "(${text_layers:-2} layers, d_model ${d_model:-32}); device $device; $ahead files read ahead of $nproc processors"
    echo "FFmpeg: $avcodec"
    printf '%-8s %9s %9s %10s %10s %12s %10s\n' clips "wall s" "s/clip" "prepare s" "encoding s" "waiting s" "loading s"
    awk -v n="$encoded" -v a="$t0" -v b="$t1" -v t="$total" -v e="$enc" -v w="$wait" -v l="$load" 'BEGIN {
        printf "%-8d %9.1f %9.3f %10.1f %10.1f %12.1f %10.1f\n", n, b - a, n ? (e + w) / n : 0, t, e, w, l }'
    echo "(s/clip: (encoding + waiting) / clips, the encoders' loading and the start left out; wall: the whole CLI)"
    awk -v e="$enc" -v w="$wait" -v d="$device" 'BEGIN {
        share = e + w > 0 ? w / (e + w) : 0
        if (share > 0.10) printf "limited by decoding: the encoders waited %.0f%% of the time for the files read ahead\n", 100 * share
        else printf "limited by the %s (encoders): waiting for decoding %.0f%% of the time\n", (d >= 0 ? "GPU" : "CPU"), 100 * share }'
} | tee "$out/prepare.md"
[ "$encoded" = "$clips" ] || { echo "prepare.sh: $encoded of $clips clips encoded (log: $out/prepare.log)" >&2; exit 1; }
exit 0
