#!/bin/sh
# example-plugin.sh: a third party's way, end to end. Install this build's core into a
# staging root (DESTDIR), build doc/examples/cosine against the staged tree with nothing but
# pkg-config and its own Makefile, install the plugin into a folder of its own, and run the
# installed CLI with it: `plugins` lists it, a configuration naming it passes --dry-run, a
# real run records its defaults, and a bad key or value fails with exit 3 and a clear line.
# Then a plugin that computes (calls a ghc_op_* of ops.h) links with -Wl,--no-undefined from
# `pkg-config --cflags --libs gh200core-ops` alone, loads, and runs its init.
# Run by `make check` (tests/local.mk sets GHC_TOP_BUILDDIR, GHC_TOP_SRCDIR and MAKE).
# Exit: 0 pass, 1 fail, 77 skip (no pkg-config). GHC_KEEP_TMP=1 keeps the temporary folder.

set -u

say() { printf 'example-plugin: %s\n' "$*"; }
fail() { printf 'example-plugin: FAIL: %s\n' "$*" >&2; exit 1; }
# Print a log file (after a failure), indented.
show() { sed 's/^/    /' "$1" >&2; }

: "${GHC_TOP_BUILDDIR:?run through make check (GHC_TOP_BUILDDIR unset)}"
: "${GHC_TOP_SRCDIR:?run through make check (GHC_TOP_SRCDIR unset)}"
MAKE=${MAKE:-make}
pkg_config=${PKG_CONFIG:-pkg-config}
if ! command -v "$pkg_config" >/dev/null 2>&1; then
    say "SKIP: $pkg_config not found; the out-of-tree build needs it"
    exit 77
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ghc-example.XXXXXX") || fail "mktemp -d failed"
# shellcheck disable=SC2317  # called by the trap
cleanup() {
    if [ -n "${GHC_KEEP_TMP:-}" ]; then
        say "kept $tmp"
    else
        chmod -R u+w "$tmp" 2>/dev/null
        rm -rf "$tmp"
    fi
}
trap cleanup EXIT
trap 'exit 1' HUP INT TERM
stage=$tmp/root

# ---- where this build installs: read from the build tree's gh200core.pc ----------------------
pc_build=$GHC_TOP_BUILDDIR/gh200core.pc
[ -r "$pc_build" ] || fail "$pc_build missing: configure and build first"
# A variable of a .pc file with ${prefix} and ${exec_prefix} expanded (autoconf's defaults
# start with them; anything else is taken as written).
# shellcheck disable=SC2016
pcvar() {
    v=$(grep "^$1=" "$pc_build" | head -n 1)
    v=${v#*=}
    case $v in
    '${prefix}'*)      v=$prefix${v#'${prefix}'} ;;
    '${exec_prefix}'*) v=$exec_prefix${v#'${exec_prefix}'} ;;
    esac
    printf '%s\n' "$v"
}
prefix=; exec_prefix=
prefix=$(pcvar prefix)
exec_prefix=$(pcvar exec_prefix)
libdir=$(pcvar libdir)
includedir=$(pcvar includedir)
case $prefix in /*) ;; *) fail "$pc_build: prefix '$prefix' is not an absolute path" ;; esac
say "this build installs into prefix=$prefix (libdir=$libdir)"

# ---- install the build into the staging root ----------------------------------------------
# The sub-makes start afresh: the jobserver and command-line variables of the `make check`
# that runs this script are not theirs (and a third party's build never sees them).
unset MAKEFLAGS MFLAGS
# What a plugin author needs (libgh200core, the headers, gh200core.pc, the CLI), not the other
# libraries nor the shipped plugins: libtool relinks a library that links another uninstalled
# one when it installs it, and a relink moves its .libs/*.so aside in the build tree for a
# moment, under the feet of the tests that load them in parallel (make -j check).
only="lib_LTLIBRARIES=libgh200core.la plugins_LTLIBRARIES="
say "$MAKE -C $GHC_TOP_BUILDDIR install DESTDIR=$stage $only"
# shellcheck disable=SC2086  # $only is two words
if ! $MAKE -C "$GHC_TOP_BUILDDIR" install DESTDIR="$stage" $only >"$tmp/install.log" 2>&1; then
    show "$tmp/install.log"
    fail "make install DESTDIR=$stage failed (log above)"
fi
pc=$(find "$stage" -name gh200core.pc -type f | head -n 1)
[ -n "$pc" ] || fail "no gh200core.pc installed under $stage"
cli=$stage$exec_prefix/bin/gh200core
[ -x "$cli" ] || fail "the installed CLI $cli is missing"
[ -d "$stage$libdir" ] || fail "the installed libdir $stage$libdir is missing"
say "installed: $pc, $cli"

# ---- pkg-config against the staged tree ---------------------------------------------------------
PKG_CONFIG_PATH=$(dirname "$pc")
export PKG_CONFIG_PATH
staged_pc="$pkg_config --define-variable=prefix=$stage$prefix"
# A libdir or includedir configured outside the prefix does not move with it: move it too.
for var in libdir includedir; do
    case $var in libdir) want=$stage$libdir ;; *) want=$stage$includedir ;; esac
    got=$($staged_pc --variable=$var gh200core) || fail "$staged_pc --variable=$var gh200core failed"
    [ "$got" = "$want" ] || staged_pc="$staged_pc --define-variable=$var=$want"
done
cflags=$($staged_pc --cflags gh200core) || fail "$staged_pc --cflags gh200core failed"
libs=$($staged_pc --libs gh200core) || fail "$staged_pc --libs gh200core failed"
say "PKG_CONFIG_PATH=$PKG_CONFIG_PATH"
say "PKG_CONFIG='$staged_pc': cflags '$cflags', libs '$libs'"
case $cflags in *"$stage"*) ;; *) fail "cflags '$cflags' do not point into $stage" ;; esac
case $libs in *"$stage"*) ;; *) fail "libs '$libs' do not point into $stage" ;; esac

# ---- build and install the example out of tree ---------------------------------------------
mkdir "$tmp/src" "$tmp/plugins" || fail "mkdir in $tmp failed"
cp -R "$GHC_TOP_SRCDIR/doc/examples/cosine/." "$tmp/src/" || fail "cannot copy doc/examples/cosine"
chmod -R u+w "$tmp/src"   # distcheck's source tree is read-only, and so are copies of it
say "$MAKE -C $tmp/src PKG_CONFIG='$staged_pc'"
if ! $MAKE -C "$tmp/src" PKG_CONFIG="$staged_pc" >"$tmp/build.log" 2>&1; then
    show "$tmp/build.log"
    fail "building doc/examples/cosine out of tree failed (log above)"
fi
cat "$tmp/build.log"
say "$MAKE -C $tmp/src install PKG_CONFIG='...' PLUGINSDIR=$tmp/plugins"
if ! $MAKE -C "$tmp/src" install PKG_CONFIG="$staged_pc" PLUGINSDIR="$tmp/plugins" >"$tmp/build.log" 2>&1; then
    show "$tmp/build.log"
    fail "make install of the example failed (log above)"
fi
so=$tmp/plugins/ghc_cosine.so
[ -f "$so" ] || fail "make install did not put ghc_cosine.so into $tmp/plugins"
# One exported symbol (doc/plugin-guide.md section 1); the linker's own markers do not count.
if command -v nm >/dev/null 2>&1; then
    syms=$(nm -D --defined-only "$so" | awk '$2 ~ /^[A-Z]$/ && $3 !~ /^(_init|_fini|_edata|_end|__bss_start)$/ { print $3 }')
    [ "$syms" = ghc_plugin_cosine ] || fail "ghc_cosine.so exports: $(printf '%s' "$syms" | tr '\n' ' '); expected only ghc_plugin_cosine"
    say "ghc_cosine.so exports only ghc_plugin_cosine"
fi

# ---- a plugin that computes: gh200core-ops.pc ------------------------------------------------
# libgh200core_ops is not installed by `make install` above (it links libgh200core.la, so
# libtool would relink it, see above): copy the built one, with its links, into the staged
# libdir, where an installed one would be. The link below checks the flags, not the file.
[ -r "$(dirname "$pc")/gh200core-ops.pc" ] ||
    fail "no gh200core-ops.pc installed beside $pc"
cp -P "$GHC_TOP_BUILDDIR"/.libs/libgh200core_ops.so* "$stage$libdir/" ||
    fail "cannot copy $GHC_TOP_BUILDDIR/.libs/libgh200core_ops.so* into $stage$libdir"
ops_cflags=$($staged_pc --cflags gh200core-ops) || fail "$staged_pc --cflags gh200core-ops failed"
ops_libs=$($staged_pc --libs gh200core-ops) || fail "$staged_pc --libs gh200core-ops failed"
say "gh200core-ops: cflags '$ops_cflags', libs '$ops_libs'"
case $ops_libs in *-lgh200core_ops*-lgh200core*) ;; *) fail "libs '$ops_libs' lack -lgh200core_ops before -lgh200core" ;; esac
mkdir "$tmp/ops" "$tmp/opsplugins" || fail "mkdir in $tmp failed"
cat >"$tmp/ops/opsflat.c" <<'EOF2'
/* opsflat.c: a scheduler that calls a compute op (ghc_op_sync, libgh200core_ops) in its init. */
#include <gh200core/ops.h>         /* defines: ghc_op_sync */
#include <gh200core/scheduler.h>   /* defines: struct ghc_scheduler_ops, ghc_register_scheduler */

static int flat_init(ghc_core_t *core, ghc_cfg_t *cfg, void **self)
{
    (void)cfg;
    *self = core;
    return ghc_op_sync(core, GHC_DEVICE_CPU, NULL);
}
static int32_t flat_micro_batches(void *self, int64_t step) { (void)self; (void)step; return 1; }
static float flat_lr_factor(void *self, int64_t step) { (void)self; (void)step; return 1.0f; }

static const struct ghc_scheduler_ops flat_ops = {
    .struct_size = sizeof(struct ghc_scheduler_ops),
    .name = "opsflat",
    .init = flat_init,
    .micro_batches = flat_micro_batches,
    .lr_factor = flat_lr_factor,
};

static int flat_plugin_init(ghc_core_t *core) { return ghc_register_scheduler(core, &flat_ops); }

GHC_PLUGIN_EXPORT const struct ghc_plugin ghc_plugin_opsflat = {
    .abi = GHC_PLUGIN_ABI, .api = GHC_API_VERSION, .struct_size = sizeof(struct ghc_plugin),
    .kinds = GHC_KIND_BIT(GHC_KIND_SCHEDULER), .name = "opsflat", .version = "1.0.0",
    .init = flat_plugin_init,
};
EOF2
cc=${CC:-cc}
say "$cc ... -shared -Wl,--no-undefined -o ghc_opsflat.so opsflat.c $ops_libs"
# shellcheck disable=SC2086  # the flags are words
if ! $cc $ops_cflags -std=c11 -fPIC -fvisibility=hidden -shared -Wl,--no-undefined \
        -o "$tmp/opsplugins/ghc_opsflat.so" "$tmp/ops/opsflat.c" $ops_libs >"$tmp/build.log" 2>&1; then
    show "$tmp/build.log"
    fail "a plugin calling ghc_op_sync does not link with pkg-config --libs gh200core-ops (log above)"
fi

# ---- run the installed CLI ------------------------------------------------------------------
# The CLI also needs libgh200core_train, not installed here (see above): it comes from the
# build tree, after the staged libgh200core and libgh200core_ops.
LD_LIBRARY_PATH=$stage$libdir:$GHC_TOP_BUILDDIR/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LD_LIBRARY_PATH
unset GHC_PLUGIN_PATH
cd "$tmp" || fail "cd $tmp"

# Run the CLI with arguments "$@"; $rc is its status, $tmp/out its stdout and stderr.
run_cli() {
    say "gh200core $*"
    "$cli" "$@" >"$tmp/out" 2>&1
    rc=$?
    sed 's/^/    /' "$tmp/out"
}

run_cli --plugin-path "$tmp/plugins" plugins
[ "$rc" -eq 0 ] || fail "gh200core plugins: exit $rc, expected 0"
awk -v so="$so" '$1 == "scheduler" && $2 == "cosine" && $4 == so { found = 1 } END { exit !found }' "$tmp/out" ||
    fail "gh200core plugins does not list scheduler 'cosine' from $so"

cat >"$tmp/train.cfg" <<'EOF'
# the example plugin's configuration: its scheduler in a real (tiny) training run with the
# shipped plugins of the build tree
mempolicy = { plugin = "host"; };
scheduler = { plugin = "cosine"; warmup_steps = 2; decay_steps = 10; };
model = { plugin = "wan22"; dtype = "f32"; device = -1;
  random = { dim = 64; ffn_dim = 128; heads = 2; layers = 1; in_channels = 16; out_channels = 16;
             text_dim = 32; freq_dim = 64; }; };
network = { plugin = "lycoris"; rank = 2; };
optimizer = { plugin = "adamw"; };
demo = { samples = 2; height = 4; width = 4; text_len = 4; text_dim = 32; };
train = { steps = 3; tensorboard = false; };
EOF
run_cli --plugin-path "$tmp/plugins" --plugin-path "$GHC_TOP_BUILDDIR/plugins/.libs" -c "$tmp/train.cfg" --dry-run
[ "$rc" -eq 0 ] || fail "--dry-run with scheduler cosine: exit $rc, expected 0"

# A real run writes the resolved configuration, with the defaults the plugin read.
run_cli --plugin-path "$tmp/plugins" --plugin-path "$GHC_TOP_BUILDDIR/plugins/.libs" -c "$tmp/train.cfg" --set output_dir="$tmp/out.d"
[ "$rc" -eq 0 ] || fail "a run with scheduler cosine: exit $rc, expected 0"
[ "$(grep -c '"loss"' "$tmp/out.d/metrics.jsonl")" -eq 3 ] ||
    fail "$tmp/out.d/metrics.jsonl does not hold the 3 steps of the run"
for key in micro_batches min_factor; do
    grep -q "^ *$key = " "$tmp/out.d/resolved.cfg" ||
        fail "$tmp/out.d/resolved.cfg lacks the default of $key (defaults are recorded)"
done

# The computing plugin loads (its ghc_op_sync resolves in the staged libgh200core_ops) and its
# init runs.
run_cli --plugin-path "$tmp/opsplugins" plugins
[ "$rc" -eq 0 ] || fail "gh200core plugins with ghc_opsflat.so: exit $rc, expected 0"
grep -q "^scheduler  *opsflat " "$tmp/out" || fail "gh200core plugins does not list scheduler 'opsflat'"
sed 's/^scheduler = .*/scheduler = { plugin = "opsflat"; };/' "$tmp/train.cfg" >"$tmp/ops.cfg" || fail "cannot write $tmp/ops.cfg"
run_cli --plugin-path "$tmp/opsplugins" --plugin-path "$GHC_TOP_BUILDDIR/plugins/.libs" -c "$tmp/ops.cfg" --dry-run
[ "$rc" -eq 0 ] || fail "--dry-run with scheduler opsflat: exit $rc, expected 0"

# An unknown key: exit 3 (configuration error), with a suggestion.
run_cli --plugin-path "$tmp/plugins" --plugin-path "$GHC_TOP_BUILDDIR/plugins/.libs" -c "$tmp/train.cfg" --dry-run --set scheduler.warmup_stepz=3
[ "$rc" -eq 3 ] || fail "--set scheduler.warmup_stepz=3: exit $rc, expected 3"
grep -F "unknown key 'warmup_stepz'" "$tmp/out" | grep -F "did you mean 'warmup_steps'" >/dev/null ||
    fail "no error line with unknown key 'warmup_stepz' and did you mean 'warmup_steps'"

# A value outside the plugin's bounds: exit 3, naming the key and the range.
run_cli --plugin-path "$tmp/plugins" --plugin-path "$GHC_TOP_BUILDDIR/plugins/.libs" -c "$tmp/train.cfg" --dry-run --set scheduler.min_factor=2
[ "$rc" -eq 3 ] || fail "--set scheduler.min_factor=2: exit $rc, expected 3"
grep -F "scheduler.min_factor = 2 is out of range [0, 1]" "$tmp/out" >/dev/null ||
    fail "no error line saying scheduler.min_factor = 2 is out of range [0, 1]"

say "PASS"
exit 0
