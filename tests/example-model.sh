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
#     (exit 3), naming the model's key;
#   - the adapter file claims no architecture (pardit names none): no Wan metadata;
#   - `gh200core estimate -c train.cfg` (the model's estimate member) gives pardit's summary and
#     its f32 weights as it stores them (computed here from the dims), also at dims where the GiB
#     tell, and activations linear in the batch;
#   - `gh200core merge --model pardit` (its merge_names member) bakes run A's adapter into a base
#     written here in pardit's naming, all zeros: all 9 modules merge, the 9 target weights are
#     no longer zero and the two other tensors are copied as they were.
# Run by `make check` (tests/local.mk sets GHC_TOP_BUILDDIR, GHC_TOP_SRCDIR and MAKE).
# Exit: 0 pass, 1 fail, 77 skip (no pkg-config). GHC_KEEP_TMP=1 keeps the temporary folder.

set -u
name=example-model
# shellcheck source-path=SCRIPTDIR source=example-lib.sh
. "${GHC_TOP_SRCDIR:?run through make check (GHC_TOP_SRCDIR unset)}/tests/example-lib.sh"

stage_install
say "gh200core-ops: libs '$($staged_pc --libs gh200core-ops)'"
build_example pardit pardit
if grep -i 'warning' "$tmp/build.log" >/dev/null; then
    fail "the example builds with warnings (log above)"
fi

# ---- run the installed CLI ------------------------------------------------------------------
# The shipped plugins (host, lycoris, adamw, constant) come from the build tree; train.cfg's
# plugin_path (".") finds ghc_pardit.so beside it.
stage_run
cd "$src" || fail "cd $src"
shipped=$GHC_TOP_BUILDDIR/plugins/.libs

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
# pardit claims no architecture: the file claims none either (no Wan metadata)
for key in ss_base_model_version modelspec.architecture modelspec.implementation; do
    if grep -F "\"$key\"" "$tmp/header" >/dev/null; then
        fail "$adapter has metadata $key, but pardit claims no architecture"
    fi
done
if grep -i 'wan' "$tmp/header" >/dev/null; then
    fail "$adapter's header mentions Wan: $(grep -io '"[^"]*wan[^"]*"' "$tmp/header" | head -n 3 | tr '\n' ' ')"
fi

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

# ---- D: estimate ----------------------------------------------------------------------------
# pardit's f32 weights as it stores them, in elements, from its dims: the 4 block linears and
# text_in keep s spare rows and s spare columns (fc1's after qkv's: D + 2s), the other linears
# (embed, time_in, mod of 3 nb + 2 vectors of D, head) none; the biases; I_C.
weights() {   # D M blocks C text_dim freq_dim spare
    awk -v D="$1" -v M="$2" -v nb="$3" -v C="$4" -v Dt="$5" -v Ft="$6" -v s="$7" 'BEGIN {
        blk = (3 * D + s) * (D + s) + 3 * D + (D + s) * (D + s) + D + (M + s) * (D + 2 * s) + M + (D + s) * (M + s) + D
        nm = 3 * nb + 2
        printf "%.0f\n", nb * blk + (D + s) * (Dt + s) + D + D * C + D + D * Ft + D + nm * D * D + nm * D + C * D + C + C * C }'
}
# The GiB of a role line of the estimate ("weights      0.123  host").
role_gib() { awk -v r="$1" '$1 == r { print $2 }' "$tmp/out"; }
gib() { awk -v n="$1" 'BEGIN { printf "%.3f\n", n / 1073741824 }'; }

n=$(weights 64 128 2 16 32 32 8)   # train.cfg's dims
run_cli -P "$shipped" -c train.cfg estimate
[ "$rc" -eq 0 ] || fail "gh200core estimate -c train.cfg: exit $rc, expected 0"
grep -F "model: pardit, 1 expert, dim 64, mlp 128, 2 parallel blocks, 9 targets (spare 8), $n f32 weights" \
    "$tmp/out" >/dev/null || fail "the estimate does not give pardit's summary with its $n f32 weights"
[ "$(role_gib weights)" = "$(gib $((4 * n)))" ] ||
    fail "the estimate's weights are $(role_gib weights) GiB, pardit's $n f32 weights $(gib $((4 * n))) GiB"
# Larger dims, so that the GiB tell: the weights, and activations linear in the batch
big="--set model.dim=2048 --set model.heads=16 --set model.mlp=8192 --set model.blocks=16"
n=$(weights 2048 8192 16 16 32 32 8)
# shellcheck disable=SC2086  # $big is words
run_cli -P "$shipped" -c train.cfg estimate $big --tokens 4096
[ "$rc" -eq 0 ] || fail "gh200core estimate $big: exit $rc, expected 0"
[ "$(role_gib weights)" = "$(gib $((4 * n)))" ] ||
    fail "with $big the estimate's weights are $(role_gib weights) GiB, pardit's $n f32 weights $(gib $((4 * n))) GiB"
act1=$(role_gib activations)
# shellcheck disable=SC2086
run_cli -P "$shipped" -c train.cfg estimate $big --tokens 4096 --batch 2
[ "$rc" -eq 0 ] || fail "gh200core estimate $big --batch 2: exit $rc, expected 0"
act2=$(role_gib activations)
awk -v a="$act1" -v b="$act2" 'BEGIN { d = b - 2 * a; exit !(a > 0.1 && d < 0.003 && d > -0.003) }' ||
    fail "activations of 2 samples ($act2 GiB) are not twice those of 1 ($act1 GiB)"
say "estimate: pardit's weights as it stores them; activations $act1 GiB per sample of 4096 tokens (dim 2048)"

# ---- E: merge into a base checkpoint ---------------------------------------------------------
# pardit has random weights and no checkpoint: a base in its naming is written here with plain
# sh, all zeros, so that the merged weights are delta-W alone: the 9 target weights [out, in]
# at train.cfg's dims, and two tensors no adapter touches (embed's weight, a bias).
# le64 N: N as 8 bytes, little-endian.
le64() {
    v=$1
    for _ in 1 2 3 4 5 6 7 8; do
        # shellcheck disable=SC2059  # the format is the octal escape
        printf "\\$(printf '%03o' $((v % 256)))"
        v=$((v / 256))
    done
}
# write_base FILE NAME:DIMxDIM...: a safetensors file of zero F32 tensors.
write_base() {
    f=$1 json='' off=0
    shift
    for t in "$@"; do
        dims=${t#*:}
        bytes=$(($(printf '%s' "$dims" | tr x '*') * 4))
        json="$json${json:+,}\"${t%%:*}\":{\"dtype\":\"F32\",\"shape\":[$(printf '%s' "$dims" | tr x ,)],\"data_offsets\":[$off,$((off + bytes))]}"
        off=$((off + bytes))
    done
    json="{$json}"
    while [ $((${#json} % 8)) -ne 0 ]; do json="$json "; done
    { le64 ${#json}; printf '%s' "$json"; head -c "$off" /dev/zero; } >"$f" || fail "cannot write $f"
}
targets="blocks.0.attn.qkv blocks.0.attn.out blocks.0.mlp.fc1 blocks.0.mlp.fc2 blocks.1.attn.qkv blocks.1.attn.out
         blocks.1.mlp.fc1 blocks.1.mlp.fc2 text_in"
write_base "$tmp/base.safetensors" embed.weight:64x16 blocks.0.attn.qkv.bias:192 \
    blocks.0.attn.qkv.weight:192x64 blocks.0.attn.out.weight:64x64 blocks.0.mlp.fc1.weight:128x64 \
    blocks.0.mlp.fc2.weight:64x128 blocks.1.attn.qkv.weight:192x64 blocks.1.attn.out.weight:64x64 \
    blocks.1.mlp.fc1.weight:128x64 blocks.1.mlp.fc2.weight:64x128 text_in.weight:64x32
run_cli inspect "$tmp/base.safetensors"
[ "$rc" -eq 0 ] || fail "gh200core inspect of the base written here: exit $rc (the script's safetensors writer is wrong)"

run_cli -P "$src" -P "$shipped" merge --model pardit --base "$tmp/base.safetensors" --adapter "$adapter" \
    --out "$tmp/merged.safetensors"
[ "$rc" -eq 0 ] || fail "gh200core merge --model pardit: exit $rc, expected 0"
grep -F "merged 9 adapter modules of $adapter" "$tmp/out" >/dev/null || fail "merge does not say it merged 9 modules"
grep -F "lora 9, loha 0, lokr 0, dora 0; 9 of 11 base tensors changed, the rest copied" "$tmp/out" >/dev/null ||
    fail "merge does not say that the 9 LoRA modules changed 9 of the 11 base tensors"
grep -F "skipped adapter keys: 0" "$tmp/out" >/dev/null || fail "merge skipped adapter keys"
run_cli inspect "$tmp/merged.safetensors"
[ "$rc" -eq 0 ] || fail "gh200core inspect $tmp/merged.safetensors: exit $rc"
grep -F "11 tensors," "$tmp/out" >/dev/null || fail "the merged file does not hold the base's 11 tensors"
mh=$(od -An -tu8 -N8 "$tmp/merged.safetensors" | tr -d ' ')
head -c "$((mh + 8))" "$tmp/merged.safetensors" | tail -c "$mh" >"$tmp/merged.header" ||
    fail "cannot read the header of $tmp/merged.safetensors"
# nonzero TENSOR: whether a byte of TENSOR in the merged file is not zero
nonzero() {
    at=$(grep -o "\"$(printf '%s' "$1" | sed 's/\./\\./g')\":{[^}]*}" "$tmp/merged.header" |
         sed -n 's/.*"data_offsets":\[\([0-9]*\),\([0-9]*\)\].*/\1 \2/p')
    [ -n "$at" ] || fail "no tensor $1 in $tmp/merged.safetensors"
    # shellcheck disable=SC2086  # two numbers
    set -- $at
    tail -c +"$((mh + 9 + $1))" "$tmp/merged.safetensors" | head -c "$(($2 - $1))" | od -An -v -tx1 |
        grep '[1-9a-f]' >/dev/null
}
for t in $targets; do
    nonzero "$t.weight" || fail "$t.weight is still all zero after the merge (W = 0 + delta-W)"
done
for t in embed.weight blocks.0.attn.qkv.bias; do
    if nonzero "$t"; then fail "$t, which no adapter adapts, changed in the merge"; fi
done
say "merge: the 9 targets' weights of a zero base are delta-W, the other tensors copied"

say "PASS"
exit 0
