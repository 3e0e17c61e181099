#!/bin/sh
# tests/fuzz/build.sh: what `make fuzz` runs (tests/fuzz/local.mk passes the variables below).
# Compiles the libraries' C sources once with the fuzzer's instrumentation into an archive,
# then links each target against it; a target that compiles a source in itself (for its static
# functions) takes that one instead of the archive's. Never part of `make`, `make check` or
# `make distcheck`: it needs a compiler with libFuzzer (clang's -fsanitize=fuzzer).
#   FUZZ_CC        the compiler (default clang)
#   FUZZ_CFLAGS    instrumentation (-fsanitize=fuzzer-no-link,address,undefined ...)
#   FUZZ_CPPFLAGS  include folders and defines of the build
#   FUZZ_PLUGINSDIR  the build's pluginsdir (GHC_PLUGINSDIR)
#   FUZZ_LIBS      libraries to link
#   FUZZ_SOURCES   the libraries' sources, relative to the source tree
#   FUZZ_TARGETS   target names (tests/fuzz/fuzz_NAME.c)
#   srcdir, builddir
set -u
cc=${FUZZ_CC:-clang}
out=$builddir/tests/fuzz
obj=$out/obj
mkdir -p "$obj" || exit 1

probe=$out/probe
printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' \
    >"$probe.c"
if ! $cc -fsanitize=fuzzer "$probe.c" -o "$probe" >/dev/null 2>&1; then
    echo "make fuzz: '$cc' cannot build libFuzzer targets (-fsanitize=fuzzer): install clang" \
         "(apt-get install clang) or set FUZZ_CC" >&2
    rm -f "$probe" "$probe.c"
    exit 1
fi
rm -f "$probe" "$probe.c"

objs=
for src in $FUZZ_SOURCES; do
    case $src in
    *.c) ;;
    *) continue ;;
    esac
    case $src in kernels/cuda/*) continue ;; esac
    o=$obj/$(printf '%s' "$src" | sed 's|/|_|g; s|\.c$|.o|')
    if [ ! -f "$o" ] || [ "$srcdir/$src" -nt "$o" ]; then
        echo "  FUZZCC   $src"
        # shellcheck disable=SC2086  # flag lists
        $cc $FUZZ_CPPFLAGS "-DGHC_PLUGINSDIR=\"$FUZZ_PLUGINSDIR\"" $FUZZ_CFLAGS -c "$srcdir/$src" -o "$o" || exit 1
    fi
    objs="$objs $o"
done
rm -f "$obj/libfuzzcore.a"
# shellcheck disable=SC2086
ar rcs "$obj/libfuzzcore.a" $objs || exit 1

# The plugins the targets run (fuzz_adapter, fuzz_optimizer, fuzz_cache), instrumented too: a target loads
# them from tests/fuzz/plugins, and their calls into the core bind to the target's own.
mkdir -p "$out/plugins" || exit 1
for p in host wan22 lycoris adamw unified_memory; do
    srcs=$(ls "$srcdir"/plugins/$p/*.c)
    case $p in
    host)           srcs="$srcs $srcdir/plugins/offload/saved.c" ;;
    unified_memory) srcs="$srcs $srcdir/plugins/disk/tcache.c" ;;
    esac
    echo "  FUZZSO   tests/fuzz/plugins/ghc_$p.so"
    # shellcheck disable=SC2086
    $cc $FUZZ_CPPFLAGS "-DGHC_PLUGINSDIR=\"$FUZZ_PLUGINSDIR\"" $FUZZ_CFLAGS -fPIC -shared $srcs \
        -o "$out/plugins/ghc_$p.so" || exit 1
done

for t in $FUZZ_TARGETS; do
    extra=
    core="$obj/libfuzzcore.a"
    case $t in
    adapter|optimizer|cache) core="-Wl,--whole-archive $core -Wl,--no-whole-archive" ;;   # for the plugins
    esac
    case $t in
    safetensors) extra="$srcdir/core/inspect.c" ;;
    ghz)         extra="$srcdir/plugins/in_memory/codec.c" ;;
    wan22)       extra=$(ls "$srcdir"/plugins/wan22/*.c) ;;
    esac
    echo "  FUZZLD   tests/fuzz/fuzz_$t"
    # -rdynamic: plugins a target loads bind to its instrumented core, not to libgh200core.so
    # shellcheck disable=SC2086
    $cc $FUZZ_CPPFLAGS "-DGHC_PLUGINSDIR=\"$FUZZ_PLUGINSDIR\"" $FUZZ_CFLAGS -fsanitize=fuzzer -rdynamic "$srcdir/tests/fuzz/fuzz_$t.c" $extra \
        $core $FUZZ_LIBS -o "$out/fuzz_$t" || exit 1
done
echo "make fuzz: built $(echo $FUZZ_TARGETS | wc -w) targets in $out (tests/fuzz/README.md: seeds and runs)"
