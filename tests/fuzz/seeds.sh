#!/bin/sh
# tests/fuzz/seeds.sh SRCDIR CORPUS BIN: each target's seed corpus from the fixtures, in
# CORPUS/<target>/ (copies: libFuzzer adds what it finds to its first corpus folder). A folder
# that exists already is left as it is (it holds an earlier run's finds). `make fuzz` runs it.
set -u
src=$1
dst=$2
bin=$3
case $dst in /*) ;; *) dst=$PWD/$dst ;; esac
seed() {   # seed TARGET FILE...: copy the files that exist into CORPUS/TARGET (once)
    t=$1
    shift
    [ -d "$dst/$t" ] && return 0
    mkdir -p "$dst/$t" || exit 1
    n=0
    for f in "$@"; do
        [ -f "$f" ] || continue
        n=$((n + 1))
        cp "$f" "$dst/$t/seed-$n-$(basename "$f")" || exit 1
    done
    echo "  SEEDS    $t: $n files"
}
fx=$src/tests/fixtures
seed safetensors "$src"/tests/data/broken/* "$fx"/*.safetensors "$fx"/sharded/*.safetensors
seed config "$src"/etc/*.cfg "$src"/doc/examples/*/*.cfg
seed sharded "$fx"/sharded/model.safetensors.index.json
seed trainer_state "$src"/tests/fuzz/seeds/trainer.json
seed adapter "$fx"/lycoris/*.safetensors
# the adapter, optimizer state and persisted tensor the targets' own runs save
for t in adapter optimizer cache; do
    mkdir -p "$dst/$t" || exit 1
    [ -f "$dst/$t/seed-own.safetensors" ] ||
        GHC_TOP_SRCDIR=$src FUZZ_SEED_OUT=$dst/$t/seed-own.safetensors "$bin/fuzz_$t" -runs=0 "$dst/$t" \
            >/dev/null 2>&1 ||
        { echo "seeds.sh: fuzz_$t could not save its seed" >&2; exit 1; }
done
# .ghz: a fixture latent framed as the in_memory backend writes it (stored, and zlib), in
# blocks of 256 bytes
if [ ! -d "$dst/ghz" ] && command -v python3 >/dev/null 2>&1; then
    mkdir -p "$dst/ghz" || exit 1
    python3 - "$fx/data/native/a.latent.safetensors" "$dst/ghz" <<'PY' || exit 1
import struct, sys, zlib
raw = open(sys.argv[1], 'rb').read()
for codec, name in ((0, 'none'), (2, 'zlib')):
    block = 256
    blocks = [raw[i:i + block] for i in range(0, len(raw), block)]
    data = [b if codec == 0 else zlib.compress(b) for b in blocks]
    head = b'GHZ1' + bytes([codec, 0, 0, 0]) + struct.pack('<IQI', block, len(raw), len(blocks))
    head += b'\0' * (32 - len(head))
    table = b''.join(struct.pack('<II', len(d), zlib.crc32(b) & 0xffffffff) for d, b in zip(data, blocks))
    open('%s/seed-%s.ghz' % (sys.argv[2], name), 'wb').write(head + table + b''.join(data))
PY
    echo "  SEEDS    ghz: 2 files"
fi
# wan22: each fixture's size (8 bytes) and its beginning up to the end of the header
# dataset: each fixture folder as one archive (name NUL, 16-bit length, bytes)
if command -v python3 >/dev/null 2>&1; then
    [ -d "$dst/wan22" ] || { mkdir -p "$dst/wan22" && python3 - "$dst/wan22" "$fx"/wan22/*.safetensors "$fx"/*.safetensors <<'PY' || exit 1
import os, struct, sys
for i, f in enumerate(sys.argv[2:]):
    b = open(f, 'rb').read()
    h = struct.unpack('<Q', b[:8])[0]
    open('%s/seed-%d-%s' % (sys.argv[1], i, os.path.basename(f)), 'wb').write(struct.pack('<Q', len(b)) + b[:8 + h])
PY
    echo "  SEEDS    wan22: $(ls "$dst/wan22" | wc -l) files"; }
    [ -d "$dst/dataset" ] || { mkdir -p "$dst/dataset" && python3 - "$dst/dataset" "$fx/data" <<'PY' || exit 1
import os, struct, sys
top = sys.argv[2]
for d in ('native', 'musubi', 'aitk', 'peers/aitk', 'peers/aitk_multi', 'peers/aitk_trigger', 'peers/musubi'):
    out = b''
    base = os.path.join(top, d)
    for root, _, files in os.walk(base):
        for f in sorted(files):
            rel = os.path.relpath(os.path.join(root, f), base)
            data = open(os.path.join(root, f), 'rb').read()[:65535]
            out += rel.encode() + b'\0' + struct.pack('<H', len(data)) + data
    open('%s/seed-%s' % (sys.argv[1], d.replace('/', '-')), 'wb').write(out)
PY
    echo "  SEEDS    dataset: $(ls "$dst/dataset" | wc -l) files"; }
fi
exit 0
