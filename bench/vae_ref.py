#!/usr/bin/env python3
"""vae_ref.py: diffusers' AutoencoderKLWan beside our Wan VAE (bench/vae.sh drives it).

    python3 bench/vae_ref.py make --names NAMES --weights W.safetensors --video V.safetensors
                                  [--frames 81] [--height 480] [--width 832] [--seed 1]
    python3 bench/vae_ref.py run --weights W.safetensors --video V.safetensors --latent REF.safetensors
                                 [--iters 3] [--device 0]
    python3 bench/vae_ref.py compare OURS.safetensors REF.safetensors

make: a full-size Wan2.1 VAE (AutoencoderKLWan's default configuration: base_dim 96, dim_mult
[1, 2, 4, 4], 2 residual blocks, z_dim 16) with random weights (PyTorch's default init, the
norms' gamma 1 + 0.2 N(0, 1) and the biases 0.1 N(0, 1) so that neither is trivial), every
parameter rounded to bf16, written as safetensors (bf16) under the official / ComfyUI names our
loader reads (NAMES: tests/fixtures/wanvae/names_wan21.txt, "diffusers-name official-name shape"
per line); and a random clip `video` [3, F, H, W] f32 uniform in [-1, 1].
run: loads that file back (official names mapped to diffusers', strict), casts the model to bf16
on the GPU (--tile N: enable_tiling with tiles of N pixels every 3/4 N) and encodes the clip (bf16, already on the GPU) once to warm up, then --iters times,
each timed with torch.cuda.synchronize; the peak of torch.cuda.max_memory_allocated over the
timed encodes (the weights, the clip and activations) and the memory reserved; writes the
normalised posterior mean (mu - mean) / std (Wan's constants, as our encode returns it) as f32
`latent` [16, T, H / 8, W / 8].
compare: max |ours - ref|, that over max |ref|, and the relative error norm.

Pinned: diffusers==0.42.1 (checked at the start of make and run; --any-version runs anyway).
Prints "RESULT ref ..." and "RESULT diff ..." lines for vae.sh. Exit status 0, 1 (a failure) or 2
(the versions or the arguments). """
import argparse
import importlib.metadata as md
import sys
import time

PINS = {"diffusers": "0.42.1"}
SEED = 1


def fail(msg, code=1):
    print("vae_ref.py: " + msg, file=sys.stderr, flush=True)
    sys.exit(code)


def check_versions(any_version):
    for pkg, want in PINS.items():
        try:
            have = md.version(pkg)
        except md.PackageNotFoundError:
            fail("%s is not installed (the benchmark is pinned to %s==%s)" % (pkg, pkg, want), 2)
        if have != want and not any_version:
            fail("%s %s found, the benchmark is pinned to %s==%s (--any-version runs anyway)" % (pkg, have, pkg, want), 2)


def read_names(path):
    """diffusers name -> official name, from a names list of the fixture script."""
    names = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2:
                names[parts[0]] = parts[1]
    return names


def make(a):
    import torch
    from diffusers import AutoencoderKLWan
    from safetensors.torch import save_file
    names = read_names(a.names)
    torch.manual_seed(SEED)
    vae = AutoencoderKLWan().eval()
    gen = torch.Generator().manual_seed(SEED + 1)
    out = {}
    with torch.no_grad():
        for name, p in vae.state_dict().items():
            if name.endswith("gamma"):
                p = 1.0 + 0.2 * torch.randn(p.shape, generator=gen)
            elif name.endswith("bias"):
                p = 0.1 * torch.randn(p.shape, generator=gen)
            if name not in names:
                fail("%s: no official name for %s in %s" % (a.weights, name, a.names))
            out[names[name]] = p.to(torch.bfloat16).contiguous()
    if len(out) != len(names):
        fail("%s lists %d tensors, the model has %d" % (a.names, len(names), len(out)))
    save_file(out, a.weights)
    gen = torch.Generator().manual_seed(SEED + 2)
    video = torch.rand((3, a.frames, a.height, a.width), generator=gen) * 2 - 1
    save_file({"video": video.contiguous()}, a.video)
    print("vae_ref.py: wrote %s (%d tensors, %.1f M parameters, bf16) and %s %s" %
          (a.weights, len(out), sum(t.numel() for t in out.values()) / 1e6, a.video, list(video.shape)), flush=True)


def run(a):
    import torch
    from diffusers import AutoencoderKLWan
    from safetensors.torch import load_file, save_file
    cuda = a.device >= 0   # -1: the CPU (a check of the script; no memory figures)
    dev = torch.device("cuda", a.device) if cuda else torch.device("cpu")
    sync = (lambda: torch.cuda.synchronize(dev)) if cuda else (lambda: None)
    print("vae_ref.py: torch %s, diffusers %s, %s" % (torch.__version__, md.version("diffusers"),
          torch.cuda.get_device_name(dev) if cuda else "cpu"), flush=True)
    off = load_file(a.weights)
    vae = AutoencoderKLWan().eval()
    names = read_names(a.names)
    back = {o: d for d, o in names.items()}
    sd = {back[k]: v for k, v in off.items()}
    vae.load_state_dict(sd, strict=True)
    vae = vae.to(device=dev, dtype=torch.bfloat16)
    if a.tile:
        stride = a.tile * 3 // 4 // 8 * 8
        vae.enable_tiling(tile_sample_min_height=a.tile, tile_sample_min_width=a.tile,
                          tile_sample_stride_height=stride, tile_sample_stride_width=stride)
    video = load_file(a.video)["video"]
    x = video.to(device=dev, dtype=torch.bfloat16).unsqueeze(0)
    mean = torch.tensor(vae.config.latents_mean, dtype=torch.float32, device=dev).view(1, -1, 1, 1, 1)
    inv_std = 1.0 / torch.tensor(vae.config.latents_std, dtype=torch.float32, device=dev).view(1, -1, 1, 1, 1)
    times = []
    with torch.no_grad():
        t0 = time.perf_counter()
        vae.encode(x)
        sync()
        print("vae_ref.py: warm-up encode %.3f s" % (time.perf_counter() - t0), flush=True)
        if cuda:
            torch.cuda.reset_peak_memory_stats(dev)
        for i in range(a.iters):
            sync()
            t0 = time.perf_counter()
            mu = vae.encode(x).latent_dist.mean
            sync()
            times.append(time.perf_counter() - t0)
            print("vae_ref.py: encode %d: %.3f s" % (i + 1, times[-1]), flush=True)
    peak = torch.cuda.max_memory_allocated(dev) if cuda else 0
    reserved = torch.cuda.max_memory_reserved(dev) if cuda else 0
    lat = ((mu.float() - mean) * inv_std)[0].cpu().contiguous()
    save_file({"latent": lat}, a.latent)
    gib = 1024.0 ** 3
    print("RESULT ref time_s=%.4f mean_s=%.4f peak_gib=%.3f reserved_gib=%.3f" %
          (min(times), sum(times) / len(times), peak / gib, reserved / gib), flush=True)


def compare(a):
    import torch
    from safetensors.torch import load_file
    ours = load_file(a.ours)["latent"].double()
    ref = load_file(a.ref)["latent"].double()
    if ours.shape != ref.shape:
        fail("latents differ in shape: ours %s, diffusers %s" % (list(ours.shape), list(ref.shape)))
    d = (ours - ref).abs()
    rel_norm = float((ours - ref).norm() / ref.norm().clamp_min(1e-30))
    print("RESULT diff max_abs=%.4g max_rel=%.4g rel_norm=%.4g shape=%s" %
          (float(d.max()), float(d.max() / ref.abs().max().clamp_min(1e-30)), rel_norm,
           "x".join(str(s) for s in ref.shape)), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--names", required=True)
    m.add_argument("--weights", required=True)
    m.add_argument("--video", required=True)
    m.add_argument("--frames", type=int, default=81)
    m.add_argument("--height", type=int, default=480)
    m.add_argument("--width", type=int, default=832)
    r = sub.add_parser("run")
    r.add_argument("--names", required=True)
    r.add_argument("--weights", required=True)
    r.add_argument("--video", required=True)
    r.add_argument("--latent", required=True)
    r.add_argument("--iters", type=int, default=3)
    r.add_argument("--device", type=int, default=0)
    r.add_argument("--tile", type=int, default=0, help="enable_tiling with tiles of N pixels every 3/4 N")
    c = sub.add_parser("compare")
    c.add_argument("ours")
    c.add_argument("ref")
    for p in (m, r):
        p.add_argument("--any-version", action="store_true", help="run with another diffusers version")
    a = ap.parse_args()
    if a.cmd in ("make", "run"):
        check_versions(a.any_version)
    {"make": make, "run": run, "compare": compare}[a.cmd](a)


if __name__ == "__main__":
    main()
