#!/bin/sh
# ffmpeg_min.sh: a minimal set of FFmpeg's shared libraries, of the version and sonames of
# Debian 12's (FFmpeg 5.1.x: libavcodec.so.59, libavformat.so.59, libavutil.so.57,
# libswscale.so.6) and the same symbol versions (LIBAVCODEC_59, ...), for a machine that has no
# FFmpeg: a gh200core built against Debian's -dev packages runs with them through
# LD_LIBRARY_PATH (bench/prepare.sh --ffmpeg-lib). Built from Debian's source package of the
# version installed here (`apt-get source ffmpeg=VERSION`, which needs a deb-src line in apt's
# sources), with nasm's assembly (as Debian builds it) and only what prepare reads and the tests
# write:
#   decoders  h264 hevc mpeg4 vp8 vp9 mjpeg png webp bmp ffv1 prores (AV1: none, FFmpeg 5.1's
#             native av1 decoder only drives hardware; Debian decodes AV1 with libdav1d)
#   encoders  mpeg4 ffv1 png mjpeg (core/media_write.c: the tests' media)
#   demuxers  mov matroska avi image2 and the png / jpeg / webp / bmp pipes; muxers mp4 matroska
#   parsers   h264 hevc mpeg4video vp8 vp9 av1 mjpeg png; protocol file; the bitstream filters
#             these select; swscale; the FFT / DCT API (av_fft_*, av_dct_*, ...: public, cheap);
#             zlib (png, matroska, mov) as the one external library (the machine's libz.so.1
#             is copied beside them).
# No hardware acceleration, no network, no programs, no libswresample / avfilter / avdevice /
# postproc (gh200core links none of them).
#
#   sh bench/ffmpeg_min.sh [--src DIR] [--jobs N] [--check BUILD] [--keep] OUTDIR
#
# --src: an unpacked FFmpeg 5.1 source tree (default: Debian's source package, fetched into a
# temporary folder); --jobs: make's -j (default: the processors); --check BUILD: a gh200core
# build tree whose libraries must find every FFmpeg symbol they use in OUTDIR/lib (and ldd
# resolve libav* / libsw* there); --keep leaves the build folder. Writes OUTDIR/lib/*.so.N
# (stripped real files under the sonames, and libz.so.1) and OUTDIR/config.txt (the configure line and
# version). Exit status 0, 1 (the build or a check failed) or 2 (setup: an argument, no source).
src='' jobs='' check='' keep=0 dest=''
while [ $# -gt 0 ]; do
    case $1 in
    --src) src=$2; shift ;;
    --jobs) jobs=$2; shift ;;
    --check) check=$2; shift ;;
    --keep) keep=1 ;;
    -h|--help) sed -n '2,/^src=/p' "$0" | sed '$d'; exit 0 ;;
    -*) echo "ffmpeg_min.sh: unknown argument '$1' (--help)" >&2; exit 2 ;;
    *) dest=$1 ;;
    esac
    shift
done
[ -n "$dest" ] || { echo "ffmpeg_min.sh: no output folder (--help)" >&2; exit 2; }
jobs=${jobs:-$(nproc 2>/dev/null || echo 2)}
command -v nasm > /dev/null 2>&1 || { echo "ffmpeg_min.sh: nasm is missing (apt-get install nasm)" >&2; exit 2; }
mkdir -p "$dest" && dest=$(cd "$dest" && pwd) || exit 2
work=$(mktemp -d /tmp/ghc-ffmin.XXXXXX)
if [ $keep = 1 ]; then echo "ffmpeg_min.sh: building in $work (kept)"; else trap 'rm -rf "$work"' EXIT; fi

# ---- the source: Debian's, of the version installed here ----
if [ -z "$src" ]; then
    ver=$(dpkg-query -W -f='${Version}' libavcodec-dev 2>/dev/null)
    [ -n "$ver" ] || ver=$(apt-cache policy ffmpeg 2>/dev/null | sed -n 's/^ *Candidate: //p')
    [ -n "$ver" ] && [ "$ver" != "(none)" ] ||
        { echo "ffmpeg_min.sh: no FFmpeg version known to apt here; give --src DIR" >&2; exit 2; }
    echo "ffmpeg_min.sh: Debian's source package ffmpeg $ver"
    if ! (cd "$work" && apt-get source -q "ffmpeg=$ver") > "$work/source.log" 2>&1; then
        tail -n 3 "$work/source.log" >&2
        echo "ffmpeg_min.sh: apt-get source failed: apt needs a deb-src line (e.g. 'Types: deb-src' beside" \
             "the 'Types: deb' entries of /etc/apt/sources.list.d/debian.sources, then apt-get update), or give --src" >&2
        exit 2
    fi
    src=$(find "$work" -maxdepth 1 -type d -name 'ffmpeg-*' | head -n 1)
fi
[ -x "$src/configure" ] && [ -f "$src/libavcodec/version_major.h" ] ||
    { echo "ffmpeg_min.sh: $src is not an FFmpeg 5.1 source tree" >&2; exit 2; }
src=$(cd "$src" && pwd)
major() { sed -n "s/^#define $2_VERSION_MAJOR *\([0-9]*\).*/\1/p" "$src/$1"; }
echo "ffmpeg_min.sh: $(cat "$src/VERSION" 2>/dev/null || echo '?') from $src: libavcodec.so.$(major libavcodec/version_major.h LIBAVCODEC)," \
     "libavformat.so.$(major libavformat/version_major.h LIBAVFORMAT), libavutil.so.$(major libavutil/version.h LIBAVUTIL)," \
     "libswscale.so.$(major libswscale/version_major.h LIBSWSCALE)"

# ---- configure and build (out of the source tree) ----
set -- --prefix="$work/inst" --enable-shared --disable-static --disable-programs --disable-doc \
    --disable-everything --disable-autodetect --disable-network --disable-debug \
    --disable-avdevice --disable-avfilter --disable-swresample --disable-postproc \
    --enable-zlib --enable-protocol=file --enable-fft --enable-dct --enable-mdct --enable-rdft \
    --enable-decoder=h264,hevc,mpeg4,vp8,vp9,mjpeg,png,webp,bmp,ffv1,prores \
    --enable-encoder=mpeg4,ffv1,png,mjpeg \
    --enable-demuxer=mov,matroska,avi,image2,image_png_pipe,image_jpeg_pipe,image_webp_pipe,image_bmp_pipe \
    --enable-muxer=mp4,matroska \
    --enable-parser=h264,hevc,mpeg4video,vp8,vp9,av1,mjpeg,png \
    --enable-bsf=h264_mp4toannexb,hevc_mp4toannexb,vp9_superframe_split,av1_frame_split,extract_extradata
mkdir -p "$work/build"
echo "ffmpeg_min.sh: configure $*" | tee "$dest/config.txt"
(cd "$work/build" && "$src/configure" "$@") > "$work/configure.log" 2>&1 ||
    { tail -n 20 "$work/configure.log"; echo "ffmpeg_min.sh: configure failed (log above)" >&2; exit 1; }
echo "ffmpeg_min.sh: make -j$jobs (a few minutes)"
(cd "$work/build" && make -j"$jobs" && make install) > "$work/make.log" 2>&1 ||
    { tail -n 20 "$work/make.log"; echo "ffmpeg_min.sh: the build failed (log above)" >&2; exit 1; }

# ---- the folder: the sonames as stripped real files ----
rm -rf "$dest/lib"
mkdir -p "$dest/lib"
for f in "$work/inst/lib"/lib*.so.*; do
    case $f in *.so.*.*) continue ;; esac   # the soname links only: libavcodec.so.59
    cp -L "$f" "$dest/lib/" && strip --strip-unneeded "$dest/lib/$(basename "$f")"
done
# zlib, which they need: any Linux has one, this makes the folder whole
z=$(ldconfig -p 2>/dev/null | awk '$1 == "libz.so.1" && /x86-64|aarch64/ { print $NF; exit }')
[ -n "$z" ] && cp -L "$z" "$dest/lib/libz.so.1"
echo "ffmpeg $(cat "$src/VERSION" 2>/dev/null), Debian source $(basename "$src")" >> "$dest/config.txt"
status=0

# ---- checks: sonames, the exported symbols and their versions against the system's, what a
# build needs ----
# the FFmpeg symbols of a library or program: "name@LIBAVCODEC_59 def" (exported) or "... und" (imported)
syms() {
    objdump -T "$1" | awk 'NF > 2 { v = $(NF-1); gsub(/[()]/, "", v)
        if (v ~ /^LIB(AV|SW)/) print $NF "@" v, (/\*UND\*/ ? "und" : "def") }'
}
for f in "$dest"/lib/lib[as]*.so.*; do
    n=$(basename "$f")
    so=$(objdump -p "$f" | sed -n 's/^ *SONAME *//p')
    [ "$so" = "$n" ] || { echo "ffmpeg_min.sh: $n has soname $so" >&2; status=1; }
    syms "$f" | sed -n 's/ def$//p' | sort -u > "$work/ours"
    vers=$(sed 's/.*@//' "$work/ours" | sort -u | tr '\n' ' ')
    sys=$(ldconfig -p 2>/dev/null | awk -v n="$n" '$1 == n { print $NF; exit }')
    line="$n: $(du -k "$f" | cut -f1) KiB, $(wc -l < "$work/ours") symbols of version $vers"
    if [ -n "$sys" ]; then
        syms "$sys" | sed -n 's/ def$//p' | sort -u > "$work/sys"
        # absent by design: VDPAU's (hardware) and the avpriv_ ones (FFmpeg's own libraries' use)
        comm -13 "$work/ours" "$work/sys" > "$work/lack"
        other=$(grep -v -e '^avpriv_' -e 'vdpau' "$work/lack" | head -n 5 | tr '\n' ' ')
        if [ -n "$other" ]; then line="$line(LACKS $(grep -c -v -e '^avpriv_' -e 'vdpau' "$work/lack") of $sys's: $other)"; status=1
        elif [ -s "$work/lack" ]; then line="$line(all of $sys's but $(wc -l < "$work/lack") private or VDPAU ones)"
        else line="$line(all of $sys's)"; fi
    fi
    echo "$line"
done
echo "total: $(du -sk "$dest/lib" | cut -f1) KiB in $dest/lib"
if [ -n "$check" ]; then
    # every FFmpeg symbol a library or program of the build imports, exported here, of its version
    for f in "$dest"/lib/lib[as]*.so.*; do syms "$f"; done | sed -n 's/ def$//p' | sort -u > "$work/have"
    : > "$work/need"
    for b in "$check"/.libs/*.so "$check"/.libs/gh200core "$check"/gh200core "$check"/tests/.libs/*; do
        [ -f "$b" ] && objdump -T "$b" > /dev/null 2>&1 || continue
        syms "$b" | sed -n 's/ und$//p' >> "$work/need"
        LD_LIBRARY_PATH="$dest/lib" ldd "$b" 2>/dev/null | awk -v d="$dest/lib/" \
            '/libav|libsw/ && index($3, d) != 1 { print "  " $0 }' > "$work/ldd"
        [ -s "$work/ldd" ] && { echo "ffmpeg_min.sh: $b resolves outside $dest/lib:"; cat "$work/ldd"; status=1; }
    done
    sort -u "$work/need" > "$work/need.s"
    [ -s "$work/need.s" ] || { echo "ffmpeg_min.sh: nothing in $check imports FFmpeg" >&2; exit 2; }
    missing=$(comm -23 "$work/need.s" "$work/have" | tr '\n' ' ')
    if [ -n "$missing" ]; then echo "ffmpeg_min.sh: symbols $check imports that $dest/lib lacks: $missing"; status=1
    else echo "check: the $(wc -l < "$work/need.s") FFmpeg symbols $check imports are all in $dest/lib, and ldd finds them there"; fi
fi
exit $status
