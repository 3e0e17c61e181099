#!/bin/sh
# e2e.sh: the whole training step beside diffusers + peft (issue 23). Runs gh200core's training
# step through the real CLI (`gh200core -c cfg`, a random model at Wan2.2 A14B expert dims,
# LoRA r16 on the 10 block linears, AdamW, batch 1, 512 text rows) under each of our plans, and
# bench/e2e_torch.py (diffusers WanTransformer3DModel + peft, gradient checkpointing), at each
# token count, each run one process under `timeout`, and prints s/step, the allocator's peak and
# the card's footprint (nvidia-smi, sampled every 0.5 s) side by side, with ours / PyTorch.
# Run from a build tree, as tests/gpu-suite.sh (the CLI at $top/.libs/gh200core, the plugins at
# $top/plugins/.libs, packed libraries in $top/.device/lib); bench/README.md has the details.
#
#   sh bench/e2e.sh [--tokens "4096 32760"] [--layers 40] [--steps 6] [--skip 2]
#                   [--plans "device:block_attn offload:block"] [--experts] [--no-torch] [--no-ours]
#                   [--tiny] [--device N] [--dims DIM:FFN:HEADS] [--text-dim N] [--timeout S]
#                   [--nproc "1 2 4"] [--set KEY=VALUE]... [--label TEXT]
#
# The same as environment variables: E2E_TOKENS, E2E_LAYERS, E2E_STEPS, E2E_SKIP, E2E_PLANS,
# E2E_EXPERTS=1, E2E_TORCH=0, E2E_OURS=0, E2E_DEVICE, E2E_DIMS, E2E_TEXT_DIM, E2E_TIMEOUT,
# E2E_NPROC. --set passes a setting to every run of ours (e.g. --set model.checkpoint_every=2),
# --label adds TEXT to their rows' names (to tell such runs apart in one table). --nproc runs each of our plans on each number N of GPUs (`gh200core --nproc N`,
# data parallel, one rank per GPU): the global batch is N samples (micro_batches = N), one per
# GPU and step, so the tokens are per GPU; the table's "x 1 GPU" is N times the 1-GPU s/step
# over the N-GPU s/step (the throughput's scaling).
# A token count is 4096 (latent 1 x 128 x 128, a 1024x1024 image), 32760 (21 x 60 x 104: 81
# frames at 480x832), a square N (1 x 2 sqrt(N) x 2 sqrt(N)) or a latent FxHxW. A plan is
# POLICY:CHECKPOINTING[:SAVED[:RESIDENT]] (policy device, offload, gh200_uvm or host;
# checkpointing off, block, block_attn or block_qkv; saved host or device, for offload and gh200_uvm;
# RESIDENT: offload's `resident` blocks kept on the device). --experts adds, per
# plan, the 2-expert model (random.experts = 2) in train.mode "separate" (switch_every = 1: the
# experts take turns every step) and "shared". --tiny: 2 blocks of dim 256 (2 heads of 128),
# ffn 704, text width 64, 64 tokens, on the CPU (--device -1, where `device` and `offload` plans
# become the `host` policy, with its ring of saved_ring = 3 for saved = "host"): a check of the
# driver on a machine without a GPU. E2E_WHL names the folder of the diffusers and peft wheels
# (default: the first .whl/ of $top, its parent, its grandparent, the working directory). Logs,
# configs, metrics, the table (e2e.md, rewritten after every run) and e2e.csv go to $OUT (or
# $top/e2e-out). Each run is limited to --timeout seconds (300). Exit status 0, or 2 when the
# CLI is missing or an argument is wrong: a run that fails (out of memory, a timeout) is a row.
top=$(cd "$(dirname "$0")/.." && pwd)
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$top/e2e-out}
tiny=0 tokens='' layers='' dims='' text_dim='' device=''
case " $* " in *" --tiny "*) tiny=1 ;; esac
if [ $tiny = 1 ]; then
    tokens=${E2E_TOKENS:-64} layers=${E2E_LAYERS:-2} dims=${E2E_DIMS:-256:704:2}
    text_dim=${E2E_TEXT_DIM:-64} device=${E2E_DEVICE:--1}
fi
tokens=${tokens:-${E2E_TOKENS:-4096 32760}}
layers=${layers:-${E2E_LAYERS:-40}}
steps=${E2E_STEPS:-6}
skip=${E2E_SKIP:-2}
plans=${E2E_PLANS:-device:block_attn offload:block}
experts=${E2E_EXPERTS:-0}
do_torch=${E2E_TORCH:-1}
do_ours=${E2E_OURS:-1}
device=${device:-${E2E_DEVICE:-0}}
dims=${dims:-${E2E_DIMS:-5120:13824:40}}
text_dim=${text_dim:-${E2E_TEXT_DIM:-4096}}
tlimit=${E2E_TIMEOUT:-300}
nprocs=${E2E_NPROC:-1}
sets=''
label_extra=''
while [ $# -gt 0 ]; do
    case $1 in
    --tokens) tokens=$2; shift ;;
    --layers) layers=$2; shift ;;
    --steps) steps=$2; shift ;;
    --skip) skip=$2; shift ;;
    --plans) plans=$2; shift ;;
    --experts) experts=1 ;;
    --no-torch) do_torch=0 ;;
    --no-ours) do_ours=0 ;;
    --device) device=$2; shift ;;
    --dims) dims=$2; shift ;;
    --text-dim) text_dim=$2; shift ;;
    --timeout) tlimit=$2; shift ;;
    --nproc) nprocs=$2; shift ;;
    --set) sets="$sets --set $2"; shift ;;
    --label) label_extra=$2; shift ;;
    --tiny) ;;   # above
    -h|--help) sed -n '2,/^top=/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "e2e.sh: unknown argument '$1' (--help)" >&2; exit 2 ;;
    esac
    shift
done
[ "$steps" -gt "$skip" ] || { echo "e2e.sh: steps ($steps) must exceed skip ($skip)" >&2; exit 2; }
IFS=: read -r dim ffn heads <<EOF
$dims
EOF
mkdir -p "$out"
work=$(mktemp -d /tmp/ghc-e2e.XXXXXX)
poller=
trap '[ -n "$poller" ] && kill "$poller" 2>/dev/null; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM
export LD_LIBRARY_PATH="$top/.device/lib:$top/.libs:$top/kernels/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export GHC_PLUGIN_PATH="$top/plugins/.libs"
# plugins load only from folders no other user can write: a tree copied here may arrive otherwise
[ -d "$GHC_PLUGIN_PATH" ] && { [ "$(id -u)" = 0 ] && chown -R 0:0 "$GHC_PLUGIN_PATH"; chmod -R go-w "$GHC_PLUGIN_PATH"; }
cli="$top/.libs/gh200core"
[ -x "$cli" ] || cli="$top/gh200core"
if [ "$do_ours" = 1 ] && [ ! -x "$cli" ]; then echo "e2e.sh: no CLI at $top/.libs/gh200core (build first)" >&2; exit 2; fi
# cuDNN for our attention's second path, as tests/gpu-suite.sh finds it (the library PyTorch ships)
if [ "$device" -ge 0 ] && [ "${GHC_CUDNN:-1}" != 0 ] && ! ldconfig -p 2>/dev/null | grep -q 'libcudnn.so.9 '; then
    for d in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
        f=$(find "$d/nvidia" -name 'libcudnn.so.9' 2>/dev/null | head -n 1)
        [ -n "$f" ] && { LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$f")"; echo "cuDNN: $f"; break; }
    done
fi
smi=0
if [ "$device" -ge 0 ] && command -v nvidia-smi > /dev/null 2>&1; then
    smi=1
    nvidia-smi -i "$device" --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
    total_mib=$(nvidia-smi -i "$device" --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
fi

# ---- diffusers and peft: from the wheels in .whl/ (the GPU machine has neither) ----
if [ "$do_torch" = 1 ]; then
    for w in "${E2E_WHL:-}" "$top/.whl" "$top/../.whl" "$top/../../.whl" "$PWD/.whl"; do
        [ -n "$w" ] && ls "$w"/*.whl > /dev/null 2>&1 || continue
        python3 -m pip install -q --no-index --no-deps --no-compile --target "$work/site" "$w"/*.whl \
            > "$out/pip.log" 2>&1 || { echo "e2e.sh: pip install from $w failed:"; tail -n 5 "$out/pip.log"; }
        export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}"
        echo "wheels: $(cd "$w" && ls ./*.whl | tr '\n' ' ')(from $w)"
        break
    done
fi

# ---- helpers ----
latent_of() {   # a token count or FxHxW -> FxHxW (the latent; patch 1x2x2)
    case $1 in
    *x*) echo "$1" ;;
    4096) echo 1x128x128 ;;
    32760) echo 21x60x104 ;;
    *) awk -v n="$1" 'BEGIN { s = int(sqrt(n) + 0.5); if (s * s != n) exit 1; printf "1x%dx%d\n", 2 * s, 2 * s }' ||
       { echo "e2e.sh: $1 tokens: give a square, 4096, 32760 or a latent FxHxW" >&2; return 1; } ;;
    esac
}
tokens_of() { echo "$1" | awk -Fx '{ print $1 * ($2 / 2) * ($3 / 2) }'; }
data_for() {    # FxHxW -> a folder with one gh200core-format sample (bf16 latent, 512 text rows)
    d="$work/data_$1"
    [ -f "$d/s0.text.safetensors" ] && return 0
    mkdir -p "$d"
    # shellcheck disable=SC2046
    python3 - "$d" 16 $(echo "$1" | tr x ' ') 512 "$text_dim" <<'EOF'
# one sample: <d>/s0.latent.safetensors `latent` [C, F, H, W] and s0.text.safetensors
# `text_embed` [L, D], bf16 normal values (the f32 draws truncated), written by hand: stdlib only
import array, json, random, struct, sys
def write(path, name, shape, rng):
    n = 1
    for s in shape:
        n *= s
    f = array.array('f', [rng.gauss(0.0, 1.0) for _ in range(n)])
    if sys.byteorder != 'little':
        f.byteswap()
    b, bf = f.tobytes(), bytearray(2 * n)
    bf[0::2], bf[1::2] = b[2::4], b[3::4]
    hdr = json.dumps({name: {"dtype": "BF16", "shape": shape, "data_offsets": [0, 2 * n]}}).encode()
    hdr += b' ' * (-len(hdr) % 8)
    with open(path, 'wb') as fh:
        fh.write(struct.pack('<Q', len(hdr)) + hdr + bf)
d, c, f, h, w, rows, tdim = sys.argv[1], *map(int, sys.argv[2:])
rng = random.Random(42)
write(d + '/s0.latent.safetensors', 'latent', [c, f, h, w], rng)
write(d + '/s0.text.safetensors', 'text_embed', [rows, tdim], rng)
EOF
}
poll_start() {  # pidfile -> the poller's pid in $poller; max MiB in $work/poll: by pid, all apps, used
    rm -f "$work/poll" "$work/poll.stop"
    [ "$smi" = 1 ] || { poller=; return; }
    base=$(nvidia-smi -i "$device" --query-gpu=memory.used --format=csv,noheader,nounits | head -n 1)
    (   mp=0; ma=0; mu=0
        while [ -d "$work" ] && [ ! -f "$work/poll.stop" ]; do
            read -r a b <<EOF2
$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null |
  awk -F', *' -v p="$(cat "$1" 2>/dev/null)" '$2 ~ /^[0-9]+$/ { a += $2; if ($1 == p) m += $2 } END { print m + 0, a + 0 }')
EOF2
            u=$(nvidia-smi -i "$device" --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -n 1)
            [ "${a:-0}" -gt "$mp" ] && mp=$a
            [ "${b:-0}" -gt "$ma" ] && ma=$b
            [ "${u:-0}" -gt "$mu" ] 2>/dev/null && mu=$u
            echo "$mp $ma $((mu > base ? mu - base : 0))" > "$work/poll"
            sleep 0.5
        done ) &
    poller=$!
}
poll_stop() {   # -> $card (GiB, "-" without nvidia-smi) and $card_src
    card=-; card_src="no nvidia-smi"
    [ -n "$poller" ] || return 0
    touch "$work/poll.stop"
    wait "$poller"
    poller=
    read -r f_pid f_all f_used < "$work/poll" 2>/dev/null || return 0
    if [ "$f_pid" -gt 0 ]; then card_src="nvidia-smi, the process"; v=$f_pid
    elif [ "$f_all" -gt 0 ]; then card_src="nvidia-smi, all compute processes (pid not seen)"; v=$f_all
    else card_src="nvidia-smi, memory.used less before the run"; v=$f_used; fi
    card=$(awk -v v="$v" 'BEGIN { printf "%.2f", v / 1024 }')
}
run_timed() {   # log pidfile cmd...: one process under timeout; its pid (exec keeps it) in pidfile
    log=$1 pidf=$2; shift 2
    rm -f "$pidf"
    poll_start "$pidf"
    timeout -k 30 "$tlimit" sh -c 'echo $$ > "$0"; exec "$@"' "$pidf" "$@" > "$log" 2>&1
    rc=$?
    poll_stop
    echo "footprint: $card GiB ($card_src)" >> "$log"
}
status_of() {   # rc log
    if [ "$1" = 0 ]; then echo ok
    elif [ "$1" = 124 ] || [ "$1" = 137 ]; then echo "timeout ${tlimit}s"
    elif grep -qiE 'out of memory|OutOfMemory' "$2"; then echo "out of memory"
    else echo "failed (exit $1)"; fi
}
median() { sort -g | awk '{ a[NR] = $1 } END { if (NR) printf "%.4f", (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2; else printf "-" }'; }
field() { grep -o "\"$1\":[^,}]*" | cut -d: -f2; }
table() {       # $work/rows -> $OUT/e2e.md and e2e.csv, rewritten after each run (a call cut short keeps them):
                # ratios ours / PyTorch of the same token count; 2-expert rows also / the 1-expert row
    {
        echo "# bench/e2e.sh: $layers blocks, dim $dim, ffn $ffn, $heads heads, text $text_dim, device $device; $(cat "$out/gpu.txt" 2>/dev/null)"
        echo
        echo "| tokens | run | s/step | peak GiB | card GiB | estimate GiB | step / PyTorch | peak / PyTorch | card / PyTorch | step / 1 expert | x 1 GPU | status |"
        echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
        awk -F'\t' '
            function r(a, b) { return (a ~ /^[0-9.]+$/ && b ~ /^[0-9.]+$/ && b > 0) ? sprintf("%.2f", a / b) : "" }
            { tok[NR] = $1; run[NR] = $2; s[NR] = $3; p[NR] = $4; c[NR] = $5; e[NR] = $6; st[NR] = $7
              if ($2 == "PyTorch") { ts[$1] = $3; tp[$1] = $4; tc[$1] = $5 }
              if ($2 !~ /experts|GPUs/) one[$1 SUBSEP $2] = $3 }
            END { for (i = 1; i <= NR; i++) {
                      x = ""; if (run[i] ~ /, 2 experts/) { b = run[i]; sub(/, 2 experts.*/, "", b); x = r(s[i], one[tok[i] SUBSEP b]) }
                      g = ""; if (run[i] ~ /, [0-9]+ GPUs$/) { b = run[i]; sub(/, [0-9]+ GPUs$/, "", b); n = run[i]
                          sub(/.*, /, "", n); n += 0; o = one[tok[i] SUBSEP b]
                          if (o ~ /^[0-9.]+$/ && s[i] ~ /^[0-9.]+$/ && s[i] > 0) g = sprintf("%.2f", n * o / s[i]) }
                      q = run[i] == "PyTorch"
                      printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", tok[i], run[i], s[i], p[i], c[i], e[i],
                          q ? "" : r(s[i], ts[tok[i]]), q ? "" : r(p[i], tp[tok[i]]), q ? "" : r(c[i], tc[tok[i]]), x, g, st[i] } }' "$work/rows"
    } > "$out/e2e.md"
    { echo "tokens,run,s_per_step,peak_gib,card_gib,estimate_gib,status"
      awk -F'\t' '{ printf "%s,\"%s\",%s,%s,%s,%s,\"%s\"\n", $1, $2, $3, $4, $5, $6, $7 }' "$work/rows"; } > "$out/e2e.csv"
}
row() {         # tokens name s/step peak card est status
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >> "$work/rows"
    table
}
: > "$work/rows"
table

# ---- our side: one config per run ----
ours() {        # lat tok plan experts mode [nproc]
    lat=$1 tok=$2 plan=$3 nexp=$4 mode=$5 np=${6:-1}
    IFS=: read -r pol ckpt saved resident <<EOF
$plan
EOF
    [ -n "$ckpt" ] || ckpt=block
    name="${tok}_$(echo "$plan" | tr : _)"
    [ "$nexp" = 2 ] && name="${name}_x2_$mode"
    label="$plan"
    [ "$nexp" = 2 ] && label="$plan, 2 experts $mode"
    [ "$np" -gt 1 ] && { name="${name}_np$np"; label="$label, $np GPUs"; }
    [ -n "$label_extra" ] && { name="${name}_$(echo "$label_extra" | tr -c 'A-Za-z0-9_\n' _)"; label="$label ($label_extra)"; }
    case $pol in
    offload|gh200_uvm) mpol="plugin = \"$pol\"; saved = \"${saved:-host}\";${resident:+ resident = $resident;}" ;;
    *) mpol="plugin = \"$pol\";" ;;
    esac
    if [ "$device" -lt 0 ]; then   # the CPU: the host policy, its ring for saved activations on the host
        case $pol:${saved:-host} in
        device:*|*:device) mpol='plugin = "host";' ;;
        *) mpol='plugin = "host"; saved_ring = 3;' ;;
        esac
    fi
    cfg="$work/$name.cfg"
    cat > "$cfg" <<EOF
# e2e.sh: $label at $tok tokens (latent $lat), written for this run
seed = 42;
mempolicy = { $mpol };
model = {
  plugin = "wan22"; dtype = "bf16"; device = $device; checkpointing = "$ckpt";
  random = { dim = $dim; ffn_dim = $ffn; heads = $heads; layers = $layers; in_channels = 16; out_channels = 16;
             text_dim = $text_dim; freq_dim = 256; experts = $nexp; seed = 7; };
};
network = { plugin = "lycoris"; algo = "lora"; rank = 16; alpha = 16.0; };
optimizer = { plugin = "adamw"; lr = 1e-4; weight_decay = 0.01; };
scheduler = { plugin = "constant"; micro_batches = $np; };
data = { batch_size = 1; datasets = ( { path = "$work/data_$lat"; } ); };
train = { steps = $steps; mode = "$mode"; switch_every = 1; max_grad_norm = 1.0; log_every = 1; tensorboard = false; };
EOF
    cp "$cfg" "$out/$name.cfg"
    est=-
    if [ "$smi" = 1 ]; then
        # shellcheck disable=SC2086
        "$cli" estimate -c "$cfg" $sets --tokens "$tok" --device-memory "$(awk -v m="$total_mib" 'BEGIN { printf "%.1f", m / 1024 }')" \
            > "$out/$name.estimate.txt" 2>&1
        est=$(grep -o '= [0-9.]* GiB of' "$out/$name.estimate.txt" | awk '{ print $2 }')
        [ -n "$est" ] || est=-
    fi
    npa=
    [ "$np" -gt 1 ] && npa="--nproc $np"
    # shellcheck disable=SC2086
    run_timed "$out/$name.log" "$work/$name.pid" "$cli" $npa -c "$cfg" --set output_dir="\"$work/run_$name\"" $sets
    st=$(status_of $rc "$out/$name.log")
    m="$work/run_$name/metrics.jsonl"
    sps=- peak=-
    # train.profile_steps (--set): where the GPU's time went
    [ -s "$work/run_$name/profile.md" ] && cp "$work/run_$name/profile.md" "$out/$name.profile.md"
    if [ -s "$m" ]; then
        cp "$m" "$out/$name.metrics.jsonl"
        sps=$(tail -n +"$((skip + 1))" "$m" | field time_step | median)
        # the policy's peak of live bytes (every location) less its host bytes at the last step
        # (pinned weights and saved units under offload, allocated once): the device's share
        pk=$(field mem_peak < "$m" | sort -g | tail -n 1)
        ho=$(tail -n 1 "$m" | field mem_host)
        peak=$(awk -v p="$pk" -v h="$ho" -v d="$device" 'BEGIN { printf "%.2f", (d < 0 ? p : p - h) / 1073741824 }')
        n=$(wc -l < "$m")
        [ "$n" -ge "$steps" ] || st="$st, $n of $steps steps"
    fi
    rm -rf "$work/run_$name"
    echo "ours $label, $tok tokens: $st, $sps s/step, peak $peak GiB, card $card GiB, estimate $est GiB"
    row "$tok" "$label" "$sps" "$peak" "$card" "$est" "$st"
}

# ---- the PyTorch side ----
theirs() {      # lat tok
    name="${2}_torch"
    dev=cuda:$device
    [ "$device" -lt 0 ] && dev=cpu
    run_timed "$out/$name.log" "$work/$name.pid" python3 "$here/e2e_torch.py" --latent "$1" --layers "$layers" \
        --dim "$dim" --ffn-dim "$ffn" --heads "$heads" --text-dim "$text_dim" --steps "$steps" --skip "$skip" --device "$dev"
    st=$(status_of $rc "$out/$name.log")
    l=$(grep '^E2E_TORCH ' "$out/$name.log" | tail -n 1)
    sps=$(echo "$l" | tr ' ' '\n' | sed -n 's/^step_s=//p')
    peak=$(echo "$l" | tr ' ' '\n' | sed -n 's/^peak_gib=//p')
    echo "PyTorch, $2 tokens: $st, ${sps:--} s/step, peak ${peak:--} GiB, card $card GiB"
    row "$2" "PyTorch" "${sps:--}" "${peak:--}" "$card" - "$st"
}

# ---- the runs: per token count PyTorch first, then our plans ----
for t in $tokens; do
    lat=$(latent_of "$t") || continue
    tok=$(tokens_of "$lat")
    echo "==== $tok tokens (latent 16 x $(echo "$lat" | sed 's/x/ x /g')), $layers blocks of dim $dim, $steps steps (median of the last $((steps - skip)))"
    [ "$do_torch" = 1 ] && theirs "$lat" "$tok"
    [ "$do_ours" = 1 ] || continue
    data_for "$lat" || { echo "e2e.sh: could not write the data for $lat"; continue; }
    for p in $plans; do
        ours "$lat" "$tok" "$p" 1 single
        for np in $nprocs; do
            [ "$np" -gt 1 ] && ours "$lat" "$tok" "$p" 1 single "$np"
        done
        if [ "$experts" = 1 ]; then
            ours "$lat" "$tok" "$p" 2 separate
            ours "$lat" "$tok" "$p" 2 shared
        fi
    done
done

echo
cat "$out/e2e.md"
exit 0
