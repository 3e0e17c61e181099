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
name=example-plugin
# shellcheck source-path=SCRIPTDIR source=example-lib.sh
. "${GHC_TOP_SRCDIR:?run through make check (GHC_TOP_SRCDIR unset)}/tests/example-lib.sh"

stage_install
cflags=$($staged_pc --cflags gh200core) || fail "$staged_pc --cflags gh200core failed"
libs=$($staged_pc --libs gh200core) || fail "$staged_pc --libs gh200core failed"
say "gh200core: cflags '$cflags', libs '$libs'"
case $cflags in *"$stage"*) ;; *) fail "cflags '$cflags' do not point into $stage" ;; esac
case $libs in *"$stage"*) ;; *) fail "libs '$libs' do not point into $stage" ;; esac

# ---- build and install the example out of tree ---------------------------------------------
build_example cosine cosine
mkdir "$tmp/plugins" || fail "mkdir $tmp/plugins failed"
say "$MAKE -C $src install PKG_CONFIG='...' PLUGINSDIR=$tmp/plugins"
if ! $MAKE -C "$src" install PKG_CONFIG="$staged_pc" PLUGINSDIR="$tmp/plugins" >"$tmp/build.log" 2>&1; then
    show "$tmp/build.log"
    fail "make install of the example failed (log above)"
fi
so=$tmp/plugins/ghc_cosine.so
[ -f "$so" ] || fail "make install did not put ghc_cosine.so into $tmp/plugins"

# ---- a plugin that computes: gh200core-ops.pc ------------------------------------------------
# (libgh200core_ops is in the staged libdir: stage_install put it there.) The link below checks
# the flags, not the file.
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
stage_run
cd "$tmp" || fail "cd $tmp"

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
