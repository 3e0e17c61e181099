#!/usr/bin/env python3
"""e2e_torch.py: the PyTorch side of bench/e2e.sh (issue 23): a LoRA training step of diffusers'
WanTransformer3DModel with peft, at the dims, targets and batch that e2e.sh gives gh200core.

    python3 bench/e2e_torch.py --latent 21x60x104 [--layers 40] [--steps 6] [--skip 2] [--device cuda]

The model: WanTransformer3DModel with random weights (seeded), made directly in the GEMM dtype
(bf16) on the device, with the modules diffusers keeps in f32 when it loads a checkpoint in bf16
(`_keep_in_fp32_modules`: rope, time embedder, scale_shift_table, norm1/2/3) moved to f32 as
from_pretrained(torch_dtype=bf16) does; the base frozen, `enable_gradient_checkpointing()`.
peft LoRA (r 16, alpha 16) through diffusers' `add_adapter` on the 10 linears of every block
(attn1 and attn2 to_q, to_k, to_v, to_out.0, ffn.net.0.proj, ffn.net.2), the adapter params in
f32 (diffusers' `cast_training_params`; `--lora-dtype model` keeps them in bf16). One step:
sigma ~ U(0, 1), x = (1 - sigma) x0 + sigma noise, target v = noise - x0, loss = mean((v_hat -
v)^2) in f32 (spec/training.md section 1), backward, gradient clipping at norm 1, AdamW (lr
1e-4, weight decay 0.01) over the adapter params. Batch 1, a random bf16 latent [1, 16, F, H,
W] and random text rows [1, 512, text_dim].

Timing: torch.cuda.synchronize() before and after each step, wall clock; the median of the steps
after the first --skip. Memory: torch.cuda.max_memory_allocated / max_memory_reserved over the
whole process. The last line is for the driver:

    E2E_TORCH latent=21x60x104 tokens=32760 layers=40 steps=6 step_s=15.7400 peak_gib=55.800 reserved_gib=58.100 loss=... times=...

Versions are pinned (the issue's baseline): diffusers 0.42.1, peft 0.21.2; others exit 2 with a
message (--any-version runs anyway). Exit status 0, 2 (setup) or 1 (the step failed: out of
memory is reported as such).
"""
import argparse
import importlib.metadata as md
import statistics
import sys
import time

PINNED = {"diffusers": "0.42.1", "peft": "0.21.2"}


def fail(msg, code=2):
    print("e2e_torch: " + msg, file=sys.stderr)
    sys.exit(code)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--latent", required=True, help="latent frames x height x width, e.g. 21x60x104")
    ap.add_argument("--layers", type=int, default=40)
    ap.add_argument("--dim", type=int, default=5120)
    ap.add_argument("--ffn-dim", type=int, default=13824)
    ap.add_argument("--heads", type=int, default=40)
    ap.add_argument("--text-dim", type=int, default=4096)
    ap.add_argument("--freq-dim", type=int, default=256)
    ap.add_argument("--text-rows", type=int, default=512)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=16.0)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--skip", type=int, default=2, help="steps left out of the median (warm-up)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16", help="the base weights and activations")
    ap.add_argument("--lora-dtype", choices=["f32", "model"], default="f32")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--any-version", action="store_true", help="run with other diffusers / peft versions")
    a = ap.parse_args()
    try:
        frames, height, width = (int(v) for v in a.latent.lower().split("x"))
    except ValueError:
        fail("--latent: want FxHxW, got %r" % a.latent)
    if height % 2 or width % 2 or a.dim % a.heads or a.steps <= a.skip:
        fail("height and width must be even, dim a multiple of heads, steps > skip")

    for pkg, want in PINNED.items():
        try:
            have = md.version(pkg)
        except md.PackageNotFoundError:
            fail("%s is not installed; want %s==%s (bench/e2e.sh installs it from the wheels in .whl/: "
                 "bench/README.md)" % (pkg, pkg, want))
        if have != want and not a.any_version:
            fail("%s %s found, the benchmark is pinned to %s==%s (--any-version runs anyway)" % (pkg, have, pkg, want))

    import torch
    import torch.nn.functional as F
    from diffusers import WanTransformer3DModel
    from peft import LoraConfig

    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    if cuda and not torch.cuda.is_available():
        fail("no CUDA device (--device cpu for a check on the CPU)")
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    print("e2e_torch: torch %s, diffusers %s, peft %s, %s" % (torch.__version__, md.version("diffusers"),
          md.version("peft"), torch.cuda.get_device_name(dev) if cuda else "cpu"), file=sys.stderr, flush=True)
    torch.manual_seed(a.seed)

    # ---- the model: weights made in the GEMM dtype on the device (no f32 copy of 14 B params) ----
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dt)
    try:
        with dev:
            model = WanTransformer3DModel(
                patch_size=(1, 2, 2), num_attention_heads=a.heads, attention_head_dim=a.dim // a.heads,
                in_channels=16, out_channels=16, text_dim=a.text_dim, freq_dim=a.freq_dim, ffn_dim=a.ffn_dim,
                num_layers=a.layers, cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6)
    finally:
        torch.set_default_dtype(prev)
    keep = getattr(model, "_keep_in_fp32_modules", None) or []
    for name, p in list(model.named_parameters()) + list(model.named_buffers()):
        if p.is_floating_point() and any(k in name.split(".") for k in keep):
            p.data = p.data.float()
    model.requires_grad_(False)
    targets = r"blocks\.\d+\.(attn1|attn2)\.(to_q|to_k|to_v|to_out\.0)|blocks\.\d+\.ffn\.net\.(0\.proj|2)"
    model.add_adapter(LoraConfig(r=a.rank, lora_alpha=a.alpha, init_lora_weights=True, target_modules=targets))
    n_lora = sum(1 for n, _ in model.named_modules() if n.endswith(".lora_A"))
    if n_lora != 10 * a.layers:
        fail("peft adapted %d modules, want %d (10 per block)" % (n_lora, 10 * a.layers))
    params = [p for p in model.parameters() if p.requires_grad]
    if a.lora_dtype == "f32":
        for p in params:
            p.data = p.data.float()
    model.enable_gradient_checkpointing()
    model.train()
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01)
    print("e2e_torch: %d blocks, %d LoRA modules, %.1f M adapter params (%s), latent [1, 16, %d, %d, %d] = %d tokens"
          % (a.layers, n_lora, sum(p.numel() for p in params) / 1e6, params[0].dtype, frames, height, width,
             frames * height * width // 4), file=sys.stderr, flush=True)

    latent = torch.randn(1, 16, frames, height, width, device=dev, dtype=dt)
    text = torch.randn(1, a.text_rows, a.text_dim, device=dev, dtype=dt)

    def step():
        sigma = torch.rand(1, device=dev)
        noise = torch.randn(latent.shape, device=dev, dtype=torch.float32)
        x0 = latent.float()
        x = ((1 - sigma) * x0 + sigma * noise).to(dt)
        pred = model(hidden_states=x, timestep=sigma * 1000, encoder_hidden_states=text, return_dict=False)[0]
        loss = F.mse_loss(pred.float(), noise - x0)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    times, loss = [], float("nan")
    try:
        for i in range(a.steps):
            if cuda:
                torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            loss = step().item()
            if cuda:
                torch.cuda.synchronize(dev)
            times.append(time.perf_counter() - t0)
            print("e2e_torch: step %d/%d  loss %.4f  %.3f s" % (i + 1, a.steps, loss, times[-1]), file=sys.stderr, flush=True)
    except torch.cuda.OutOfMemoryError as e:
        print("e2e_torch: out of memory at step %d: %s" % (len(times) + 1, e), file=sys.stderr)
        sys.exit(1)
    gib = 1024.0 ** 3
    peak = "%.3f" % (torch.cuda.max_memory_allocated(dev) / gib) if cuda else "-"
    reserved = "%.3f" % (torch.cuda.max_memory_reserved(dev) / gib) if cuda else "-"
    print("E2E_TORCH latent=%dx%dx%d tokens=%d layers=%d steps=%d step_s=%.4f peak_gib=%s reserved_gib=%s loss=%.6g times=%s"
          % (frames, height, width, frames * height * width // 4, a.layers, a.steps, statistics.median(times[a.skip:]),
             peak, reserved, loss, ",".join("%.4f" % t for t in times)), flush=True)


if __name__ == "__main__":
    main()
