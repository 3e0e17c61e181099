#!/usr/bin/env python3
"""umt5_ref.py: the PyTorch side of bench/umt5.sh: transformers' UMT5EncoderModel at umT5-XXL's
shape (vocab 256384, d_model 4096, 64 heads of 64, d_ff 10240, 24 layers; --layers fewer) with
random weights, in bf16 on the GPU.

  make:    draw the weights (seeded; norms 1, linears normal with variance 1 / fan-in, the
           embedding standard normal, the bias tables normal times 0.1, as gh200core's random
           encoder), write them as DIR/weights.safetensors in transformers' names (shared.weight,
           encoder.block.{i}.layer..., which our loader reads), a batch of prompts as
           DIR/inputs.safetensors (I32 ids and mask [B, L]: random ids, the EOS, lengths L,
           L/2, L-2, L/8, L-4, L/16, ...), time the forward (after --warmup calls, the mean of --iters, each ended by
           torch.cuda.synchronize; also with the output brought to the host in f32, as our encoder
           returns it) and the allocator's peak (max_memory_allocated: weights + activations), and
           write the output as DIR/ref.safetensors ("bf16": the bf16 model's last hidden state,
           "f32": the same weights' forward in f32, the accuracy reference) and the timings as
           DIR/torch.txt.
  compare: read DIR/torch.txt, DIR/ours.txt (bench_umt5's line) and DIR/ours.safetensors, and
           print both times, peaks, the ratio, and the max abs and relative differences over the
           prompts' true rows: ours vs PyTorch bf16, and each vs the f32 forward.

Every module runs in bf16 (wo included: from_pretrained would keep wo in f32; Wan's own T5 runs
all in bf16), eager attention (UMT5 has no SDPA path: its position bias). Versions are pinned:
transformers 5.24.0, safetensors 0.8.0, torch 2.11.x; others exit 2 (--any-version runs anyway).
"""
import argparse
import importlib.metadata as md
import os
import sys
import time

PINNED = {"transformers": "5.24.0", "safetensors": "0.8.0"}
TORCH = "2.11."


def fail(msg, code=2):
    print("umt5_ref: " + msg, file=sys.stderr, flush=True)
    sys.exit(code)


def check_versions(any_version):
    for pkg, want in list(PINNED.items()) + [("torch", TORCH)]:
        try:
            have = md.version(pkg)
        except md.PackageNotFoundError:
            fail("%s is not installed; want %s %s (bench/umt5.sh installs transformers from the wheels in .whl/: "
                 "bench/README.md)" % (pkg, pkg, want))
        ok = have.startswith(want) if pkg == "torch" else have == want
        if not ok and not any_version:
            fail("%s %s found, the benchmark is pinned to %s %s (--any-version runs anyway)" % (pkg, have, pkg, want))


def make(a):
    import torch
    from safetensors.torch import save_file
    from transformers import UMT5Config, UMT5EncoderModel

    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    if cuda and not torch.cuda.is_available():
        fail("no CUDA device (--device cpu checks the script on the CPU, slowly)")
    torch.backends.cuda.matmul.allow_tf32 = False   # the f32 reference in f32
    cfg = UMT5Config(vocab_size=a.vocab, d_model=4096, d_kv=64, d_ff=10240, num_layers=a.layers, num_heads=64,
                     relative_attention_num_buckets=32, relative_attention_max_distance=128, dropout_rate=0.0,
                     layer_norm_epsilon=1e-6, feed_forward_proj="gated-gelu")
    print("umt5_ref: torch %s, transformers %s, %s" % (torch.__version__, md.version("transformers"),
          torch.cuda.get_device_name(dev) if cuda else "cpu"), file=sys.stderr, flush=True)
    torch.manual_seed(a.seed)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(dev):
        model = UMT5EncoderModel(cfg)
    torch.set_default_dtype(prev)
    model.eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layer_norm.weight"):
                p.fill_(1.0)
            elif "relative_attention_bias" in name:
                p.normal_(0.0, 0.1)
            elif name == "shared.weight":
                p.normal_(0.0, 1.0)
            else:
                p.normal_(0.0, p.shape[1] ** -0.5)
    # transformers' names, the embedding once (encoder.embed_tokens.weight is tied to it)
    sd = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items() if k != "encoder.embed_tokens.weight"}
    os.makedirs(a.dir, exist_ok=True)
    t0 = time.time()
    save_file(sd, os.path.join(a.dir, "weights.safetensors"))
    del sd
    print("umt5_ref: wrote %s in %.1f s" % (os.path.join(a.dir, "weights.safetensors"), time.time() - t0),
          file=sys.stderr, flush=True)

    B, L = a.batch, a.len
    g = torch.Generator().manual_seed(a.seed + 1)
    ids = torch.randint(2, cfg.vocab_size, (B, L), generator=g, dtype=torch.int32)
    lens = [max(1, L >> min(b, 4)) if b % 2 else L - b for b in range(B)]   # L, L/2, L-2, L/8, ...
    mask = torch.zeros(B, L, dtype=torch.int32)
    for b, n in enumerate(lens):
        mask[b, :n] = 1
        ids[b, n - 1] = 1          # the EOS
        ids[b, n:] = 0             # padding
    save_file({"ids": ids, "mask": mask}, os.path.join(a.dir, "inputs.safetensors"))

    ids_d, mask_d = ids.to(dev, torch.long), mask.to(dev, torch.long)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()

    def fwd():
        return model(input_ids=ids_d, attention_mask=mask_d).last_hidden_state

    with torch.inference_mode():
        for _ in range(a.warmup):
            fwd()
        sync()
        ts, th = [], []
        for _ in range(a.iters):
            t0 = time.perf_counter()
            fwd()
            sync()
            ts.append(time.perf_counter() - t0)
        for _ in range(a.iters):   # with the output on the host in f32, as our encoder returns it
            t0 = time.perf_counter()
            yh = fwd().float().cpu()
            th.append(time.perf_counter() - t0)
        peak = torch.cuda.max_memory_allocated() if cuda else 0
        free, total = torch.cuda.mem_get_info() if cuda else (0, 0)
        out_bf16 = yh
        # the accuracy reference: the same weights in f32
        model.float()
        sync()
        out_f32 = fwd().float().cpu()
    save_file({"bf16": out_bf16.contiguous(), "f32": out_f32.contiguous(), "mask": mask},
              os.path.join(a.dir, "ref.safetensors"))
    line = ("torch: encode_ms=%.2f min_ms=%.2f host_ms=%.2f peak_gib=%.3f card_gib=%.3f B=%d L=%d layers=%d"
            % (1e3 * sum(ts) / len(ts), 1e3 * min(ts), 1e3 * sum(th) / len(th), peak / 2**30, (total - free) / 2**30,
               B, L, a.layers))
    with open(os.path.join(a.dir, "torch.txt"), "w") as f:
        f.write(line + "\n")
    print(line, flush=True)


def fields(path):
    with open(path) as f:
        line = f.read().strip().splitlines()[-1]
    return dict(kv.split("=", 1) for kv in line.split()[1:])


def compare(a):
    import torch
    from safetensors.torch import load_file

    ref = load_file(os.path.join(a.dir, "ref.safetensors"))
    ours = load_file(os.path.join(a.dir, "ours.safetensors"))["out"].float()
    mask = ref["mask"].bool()
    sel = mask.unsqueeze(-1).expand_as(ours)
    y32, ybf = ref["f32"][sel], ref["bf16"][sel]
    yo = ours[sel]
    t, o = fields(os.path.join(a.dir, "torch.txt")), fields(os.path.join(a.dir, "ours.txt"))

    def diff(x, r):
        d = (x - r).abs()
        return "max abs %.4g (max |ref| %.4g), max abs / max |ref| %.4g, rel l2 %.4g" % (
            d.max().item(), r.abs().max().item(), d.max().item() / r.abs().max().item(), (d.norm() / r.norm()).item())

    print("umT5 encoder, %s prompts x %s positions, %s layers, bf16 (%d true rows)"
          % (t["B"], t["L"], t["layers"], int(mask.sum())))
    print("%-22s %12s %12s %14s %12s" % ("", "encode ms", "min ms", "peak GiB", "card GiB"))
    print("%-22s %12s %12s %14s %12s" % ("ours (host out)", o["encode_ms"], o["min_ms"], o["pool_peak_gib"],
                                         o["card_gib"]))
    print("%-22s %12s %12s %14s %12s" % ("transformers", t["encode_ms"], t["min_ms"], t["peak_gib"], t["card_gib"]))
    print("%-22s %12s" % ("ours one by one", o["per_prompt_ms"]))
    print("%-22s %12s" % ("transformers host out", t["host_ms"]))
    peak = float(t["peak_gib"])
    print("time ours / transformers: %.3f (host out: %.3f); peak ours / transformers: %s"
          % (float(o["encode_ms"]) / float(t["encode_ms"]), float(o["encode_ms"]) / float(t["host_ms"]),
             "%.3f" % (float(o["pool_peak_gib"]) / peak) if peak > 0 else "- (cpu)"))
    print("ours vs transformers bf16:  " + diff(yo, ybf))
    print("ours vs the f32 forward:    " + diff(yo, y32))
    print("transformers bf16 vs f32:   " + diff(ybf, y32))
    print("ours load: %s s" % o["load_s"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["make", "compare"])
    ap.add_argument("--dir", required=True, help="where the weights, inputs and results go")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--len", type=int, default=512)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=256384, help="embedding rows (umT5: 256384)")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a check of the script")
    ap.add_argument("--any-version", action="store_true", help="run with other transformers / torch versions")
    a = ap.parse_args()
    if a.batch < 1 or a.len < 16 or a.layers < 1 or a.iters < 1 or a.vocab < 2:
        fail("--batch >= 1, --len >= 16, --layers >= 1, --iters >= 1, --vocab >= 2")
    check_versions(a.any_version)
    make(a) if a.mode == "make" else compare(a)


if __name__ == "__main__":
    main()
