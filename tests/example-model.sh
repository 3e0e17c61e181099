#!/bin/sh
# example-model.sh: a second model, written as a third party would, trains through the contract
# alone. Install this build's core into a staging root (DESTDIR), build doc/examples/pardit (a
# small parallel-block DiT, not Wan) against the staged tree with nothing but pkg-config
# (gh200core-ops) and its own Makefile, and train a LoRA on it with its train.cfg, the embedded
# demo's data and the shipped lycoris, adamw and constant plugins. Asserts:
#   - the plugin exports only its descriptor, `plugins` lists model 'pardit';
#   - the run finishes, every loss is finite and the loss falls; the adapter file holds
#     lora_down and lora_up tensors for each of the model's 9 targets (the block linears by
#     their names, blocks.N.attn.qkv ..., and text_in);
#   - the model's log says all 9 targets K-concatenate (spare = 8 >= rank 4), and a run with
#     model.spare = 0 (none does: the adapter's own passes) gives the same loss at every step;
#   - a run resumed from the first run's step-20 checkpoint gives its losses of steps 21 to 40
#     and the same adapter tensors, bit for bit (CPU);
#   - the model's input_spec is checked: demo text of another width is refused before the run
#     (exit 3), naming the model's key.
# Run by `make check` (tests/local.mk sets GHC_TOP_BUILDDIR, GHC_TOP_SRCDIR and MAKE).
# Exit: 0 pass, 1 fail, 77 skip (no pkg-config). GHC_KEEP_TMP=1 keeps the temporary folder.

set -u

say() { printf 'example-model: %s\n' "$*"; }
fail() { printf 'example-model: FAIL: %s\n' "$*" >&2; exit 1; }
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

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ghc-model.XXXXXX") || fail "mktemp -d failed"
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

# ---- install the build into the staging root ----------------------------------------------
# As tests/example-plugin.sh does, and for the same reasons: libgh200core, the headers, the .pc
# files and the CLI only (no relinking of the libraries under the feet of parallel tests);
# libgh200core_ops is copied into the staged libdir, where an installed one would be.
unset MAKEFLAGS MFLAGS
only="lib_LTLIBRARIES=libgh200core.la plugins_LTLIBRARIES="
say "$MAKE -C $GHC_TOP_BUILDDIR install DESTDIR=$stage $only"
# shellcheck disable=SC2086  # $only is two words
if ! $MAKE -C "$GHC_TOP_BUILDDIR" install DESTDIR="$stage" $only >"$tmp/install.log" 2>&1; then
    show "$tmp/install.log"
    fail "make install DESTDIR=$stage failed (log above)"
fi
pc=$(find "$stage" -name gh200core.pc -type f | head -n 1)
[ -n "$pc" ] || fail "no gh200core.pc installed under $stage"
[ -r "$(dirname "$pc")/gh200core-ops.pc" ] || fail "no gh200core-ops.pc installed beside $pc"
cli=$stage$exec_prefix/bin/gh200core
[ -x "$cli" ] || fail "the installed CLI $cli is missing"
cp -P "$GHC_TOP_BUILDDIR"/.libs/libgh200core_ops.so* "$stage$libdir/" ||
    fail "cannot copy $GHC_TOP_BUILDDIR/.libs/libgh200core_ops.so* into $stage$libdir"

PKG_CONFIG_PATH=$(dirname "$pc")
export PKG_CONFIG_PATH
staged_pc="$pkg_config --define-variable=prefix=$stage$prefix"
for var in libdir includedir; do
    case $var in libdir) want=$stage$libdir ;; *) want=$stage$includedir ;; esac
    got=$($staged_pc --variable=$var gh200core) || fail "$staged_pc --variable=$var gh200core failed"
    [ "$got" = "$want" ] || staged_pc="$staged_pc --define-variable=$var=$want"
done
say "PKG_CONFIG='$staged_pc': libs '$($staged_pc --libs gh200core-ops)'"

# ---- build the example out of tree ----------------------------------------------------------
src=$tmp/pardit
mkdir "$src" || fail "mkdir $src failed"
cp -R "$GHC_TOP_SRCDIR/doc/examples/pardit/." "$src/" || fail "cannot copy doc/examples/pardit"
chmod -R u+w "$src"   # distcheck's source tree is read-only, and so are copies of it
rm -rf "$src/output" "$src/ghc_pardit.so"
say "$MAKE -C $src PKG_CONFIG='$staged_pc'"
if ! $MAKE -C "$src" PKG_CONFIG="$staged_pc" >"$tmp/build.log" 2>&1; then
    show "$tmp/build.log"
    fail "building doc/examples/pardit out of tree failed (log above)"
fi
cat "$tmp/build.log"
if grep -i 'warning' "$tmp/build.log" >/dev/null; then
    fail "the example builds with warnings (log above)"
fi
so=$src/ghc_pardit.so
[ -f "$so" ] || fail "make did not build $so"
if command -v nm >/dev/null 2>&1; then
    syms=$(nm -D --defined-only "$so" | awk '$2 ~ /^[A-Z]$/ && $3 !~ /^(_init|_fini|_edata|_end|__bss_start)$/ { print $3 }')
    [ "$syms" = ghc_plugin_pardit ] || fail "ghc_pardit.so exports: $(printf '%s' "$syms" | tr '\n' ' '); expected only ghc_plugin_pardit"
    say "ghc_pardit.so exports only ghc_plugin_pardit"
fi

# ---- run the installed CLI ------------------------------------------------------------------
# The CLI also needs libgh200core_train (not installed here): from the build tree, after the
# staged libraries. The shipped plugins (host, lycoris, adamw, constant) come from the build
# tree; train.cfg's plugin_path (".") finds ghc_pardit.so beside it.
LD_LIBRARY_PATH=$stage$libdir:$GHC_TOP_BUILDDIR/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LD_LIBRARY_PATH
unset GHC_PLUGIN_PATH
cd "$src" || fail "cd $src"
shipped=$GHC_TOP_BUILDDIR/plugins/.libs

# Run the CLI with arguments "$@"; $rc is its status, $tmp/out its stdout and stderr.
run_cli() {
    say "gh200core $*"
    "$cli" "$@" >"$tmp/out" 2>&1
    rc=$?
    sed 's/^/    /' "$tmp/out"
}
# The "loss" of each step of a run's metrics.jsonl, one "step loss" per line.
losses() { sed -n 's/.*"step":\([0-9]*\),"loss":\([^,]*\),.*/\1 \2/p' "$1/metrics.jsonl"; }

run_cli -P "$src" plugins
[ "$rc" -eq 0 ] || fail "gh200core plugins: exit $rc, expected 0"
awk -v so="$so" '$1 == "model" && $2 == "pardit" && $4 == so { found = 1 } END { exit !found }' "$tmp/out" ||
    fail "gh200core plugins does not list model 'pardit' from $so"

# The data against the model (input_spec): demo text 31 wide, the model's is 32.
run_cli -P "$shipped" -c train.cfg --dry-run --set demo.text_dim=31
[ "$rc" -eq 3 ] || fail "--set demo.text_dim=31: exit $rc, expected 3 (the model's input_spec refuses it)"
grep -F "demo.text_dim = 31" "$tmp/out" | grep -F "model.text_dim at train.cfg:" >/dev/null ||
    fail "no error line naming demo.text_dim = 31 and the model's key model.text_dim at train.cfg:N"

# ---- A: K-concatenation (spare = 8, rank 4) -------------------------------------------------
run_cli -P "$shipped" -c train.cfg --set output_dir='"a"'
[ "$rc" -eq 0 ] || fail "training pardit: exit $rc, expected 0"
grep -F "pardit: 9 of 9 adapted targets K-concatenate (spare = 8)" "$tmp/out" >/dev/null ||
    fail "the model does not say that its 9 targets K-concatenate"
losses a >"$tmp/a.loss"
[ "$(wc -l <"$tmp/a.loss")" -eq 40 ] || fail "a/metrics.jsonl does not hold the 40 steps of the run"
awk '$2 !~ /^-?[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?$/ { bad = bad " step " $1 ": " $2 }
     END { if (bad != "") { print "example-model: not finite:" bad; exit 1 } }' "$tmp/a.loss" ||
    fail "a loss of run a is not a finite number"
first=$(head -n 1 "$tmp/a.loss" | cut -d' ' -f2)
last=$(sed -n 's/.*"loss_avg":\([^,]*\),.*/\1/p' a/metrics.jsonl | tail -n 1)
awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < f / 2) }' ||
    fail "the loss does not fall: step 1 $first, the last steps' average $last (expected below half)"
say "loss: step 1 $first, the last steps' average $last"

adapter=a/adapter.safetensors
[ -f "$adapter" ] || fail "no adapter file $adapter"
n=$(od -An -tu8 -N8 "$adapter" | tr -d ' ')
head -c "$((n + 8))" "$adapter" >"$tmp/header" || fail "cannot read the header of $adapter"
for b in 0 1; do
    for t in attn_qkv attn_out mlp_fc1 mlp_fc2; do
        for f in lora_down lora_up; do
            grep -F "\"lora_unet_blocks_${b}_$t.$f.weight\"" "$tmp/header" >/dev/null ||
                fail "$adapter lacks lora_unet_blocks_${b}_$t.$f.weight (target blocks.$b.${t%%_*}.${t#*_})"
        done
    done
done
for f in lora_down lora_up; do
    grep -F "\"lora_unet_text_in.$f.weight\"" "$tmp/header" >/dev/null || fail "$adapter lacks lora_unet_text_in.$f.weight"
done
say "$adapter holds the LoRA of all 9 targets"

# ---- B: no spare room: the adapter's own passes, the same losses ------------------------------
run_cli -P "$shipped" -c train.cfg --set output_dir='"b"' --set model.spare=0
[ "$rc" -eq 0 ] || fail "training pardit with model.spare = 0: exit $rc, expected 0"
grep -F "pardit: 0 of 9 adapted targets K-concatenate (spare = 0)" "$tmp/out" >/dev/null ||
    fail "with spare = 0 the model does not say that no target K-concatenates"
losses b >"$tmp/b.loss"
paste -d' ' "$tmp/a.loss" "$tmp/b.loss" | awk '
    { d = $2 - $4; if (d < 0) d = -d; r = d / ($2 > 1e-30 ? $2 : 1e-30); if (r > worst) { worst = r; at = $1 } n++ }
    END { printf "example-model: K-concatenation against the passes: %d steps, worst relative difference %g (step %s)\n", n, worst, at;
          exit !(n == 40 && worst <= 1e-4) }' ||
    fail "the losses with and without K-concatenation differ (more than 1e-4 relative, or not 40 steps each)"

# ---- C: resumed from A's checkpoint at step 20 ------------------------------------------------
[ -d a/checkpoint-20 ] || fail "run a left no a/checkpoint-20"
run_cli -P "$shipped" -c train.cfg --set output_dir='"c"' --resume a/checkpoint-20
[ "$rc" -eq 0 ] || fail "resuming from a/checkpoint-20: exit $rc, expected 0"
losses c >"$tmp/c.loss"
sed -n '21,40p' "$tmp/a.loss" | cmp -s - "$tmp/c.loss" ||
    fail "the resumed run's losses are not those of steps 21 to 40 of run a"
# the tensors after the header (the header's metadata holds the date)
tail -c +"$((n + 9))" "$adapter" >"$tmp/a.data"
m=$(od -An -tu8 -N8 c/adapter.safetensors | tr -d ' ')
tail -c +"$((m + 9))" c/adapter.safetensors >"$tmp/c.data"
cmp -s "$tmp/a.data" "$tmp/c.data" || fail "the resumed run's adapter tensors differ from run a's"
say "the resumed run gives run a's steps 21 to 40 and its adapter"

say "PASS"
exit 0
