#!/usr/bin/env python3
"""bench_torch.py: PyTorch at the shapes of bench_ops.c, in the same table format, and (with
--ours CSV from bench_ops) both side by side with the ratio ours / PyTorch.

    python3 bench/bench_torch.py [--ours ours.csv] [--csv torch.csv] [--iters N] [--quick]

Attention: torch.nn.functional.scaled_dot_product_attention on [B, L, H, Dh] tensors viewed as
[B, H, L, Dh] (the layout of our kernels), once with the cuDNN backend and once with the
FlashAttention-2 backend. GEMMs: F.linear (cuBLASLt with a bias epilogue). Timing: CUDA
events around each call after warm-up (a few calls, then about 250 ms more), median. FLOPs counted as in bench_ops.c.
"""
import argparse
import csv
import math
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def time_ms(fn, warm, n):
    """Median ms of n calls after `warm` calls and about 250 ms more (as bench_ops.c)."""
    for _ in range(warm):
        fn()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn()
    e.record()
    torch.cuda.synchronize()
    one = s.elapsed_time(e)
    for _ in range(min(int(250.0 / one), 1000) if one > 0 else 0):
        fn()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for s, e in ev:
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in ev)


class Table:
    def __init__(self, out_csv):
        self.rows = []
        self.peak_tf = 0.0
        self.peak_gbs = 0.0
        self.csv = open(out_csv, "w", newline="") if out_csv else None
        if self.csv:
            self.csv.write("impl,op,shape,ms,tflops,gbs\n")

    def row(self, op, shape, ms, flops=0.0, nbytes=0.0, pct_of="tf"):
        tf = flops / (ms * 1e-3) / 1e12 if flops else 0.0
        gbs = nbytes / (ms * 1e-3) / 1e9 if nbytes else 0.0
        pct = ""
        if tf and self.peak_tf and pct_of == "tf":
            pct = "%5.1f%%" % (100 * tf / self.peak_tf)
        elif gbs and self.peak_gbs:
            pct = "%5.1f%%" % (100 * gbs / self.peak_gbs)
        print("%-24s %-30s %10.3f %10.1f %10.1f %8s" % (op, shape, ms, tf, gbs, pct), flush=True)
        self.rows.append((op, shape, ms, tf, gbs))
        if self.csv:
            self.csv.write("torch,%s,%s,%.6f,%.3f,%.3f\n" % (op, shape, ms, tf, gbs))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", help="CSV written by bench_ops --csv")
    ap.add_argument("--csv", help="write PyTorch's rows here")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    props = torch.cuda.get_device_properties(0)
    print("GPU: %s (torch %s, cuDNN %s); median of %d timed calls"
          % (props.name, torch.__version__, torch.backends.cudnn.version(), a.iters))
    print("%-24s %-30s %10s %10s %10s %8s" % ("op", "shape", "ms", "TFLOP/s", "GB/s", "of peak"))
    t = Table(a.csv)
    g = torch.Generator(device=dev)
    g.manual_seed(1234)

    def randn(*shape, amp=1.0):
        return (torch.randn(*shape, device=dev, dtype=torch.float32, generator=g) * amp).to(torch.bfloat16)

    # peaks
    n = 8192
    x, w = randn(n, n), randn(n, n)
    ms = time_ms(lambda: torch.mm(x, w.t()), 5, a.iters)
    t.peak_tf = 2 * n ** 3 / (ms * 1e-3) / 1e12
    t.row("peak: gemm bf16", "8192x8192x8192", ms, 2 * n ** 3)
    del x, w
    nb = 2 << 30
    src = torch.empty(nb, dtype=torch.uint8, device=dev).fill_(0x3C)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), 3, a.iters)
    t.peak_gbs = 2 * nb / (ms * 1e-3) / 1e9
    t.row("peak: d2d copy (r+w)", "2 GiB", ms, 0, 2 * nb, pct_of="gbs")
    del src, dst

    def linear(name, M, K, N, gelu=False):
        x, w, b = randn(M, K), randn(N, K, amp=0.02), randn(N, amp=0.1)
        if gelu:
            fn = lambda: F.gelu(F.linear(x, w, b), approximate="tanh")
        else:
            fn = lambda: F.linear(x, w, b)
        ms = time_ms(fn, 3, a.iters)
        t.row(name, "%dx%d->%d" % (M, K, N), ms, 2.0 * M * N * K)

    for M in ([4096] if a.quick else [4096, 32760]):
        linear("gemm bf16 qkvo +bias", M, 5120, 5120)
        linear("gemm bf16 ffn-up +bias", M, 5120, 13824)
        linear("gemm bf16 ffn-up +gelu", M, 5120, 13824, gelu=True)
        linear("gemm bf16 ffn-down +bias", M, 13824, 5120)
    try:   # fp8 x W^T with per-tensor scales, bf16 out (torch._scaled_mm), + bias
        M, K, N = 4096, 5120, 5120
        x8 = randn(M, K).to(torch.float8_e4m3fn)
        w8 = randn(N, K).to(torch.float8_e4m3fn)
        b = randn(N, amp=0.1)
        sa = torch.tensor(1.0, device=dev)
        sb = torch.tensor(0.02, device=dev)
        fn = lambda: torch._scaled_mm(x8, w8.t(), scale_a=sa, scale_b=sb, bias=b, out_dtype=torch.bfloat16)
        ms = time_ms(fn, 3, a.iters)
        t.row("gemm fp8 qkvo +bias", "%dx%d->%d" % (M, K, N), ms, 2.0 * M * N * K)
    except Exception as e:  # noqa: BLE001
        print("gemm fp8: skipped (%s)" % e)

    def attention(B, L, H, D):
        shape = "B%d L%d H%d D%d" % (B, L, H, D)
        nn = min(a.iters, 5) if L > 8192 else a.iters
        fwd_flops = 4.0 * B * H * L * L * D
        q, k, v, do = (randn(B, L, H, D) for _ in range(4))
        for backend, tag in ((SDPBackend.CUDNN_ATTENTION, "cudnn"), (SDPBackend.FLASH_ATTENTION, "flash2")):
            qg, kg, vg = (x.clone().requires_grad_(True) for x in (q, k, v))
            qt, kt, vt = (x.transpose(1, 2) for x in (qg, kg, vg))
            dot = do.transpose(1, 2)
            try:
                with sdpa_kernel([backend]):
                    def fwd():
                        with torch.no_grad():
                            return F.scaled_dot_product_attention(qt, kt, vt)

                    def fwd_bwd():
                        qg.grad = kg.grad = vg.grad = None
                        out = F.scaled_dot_product_attention(qt, kt, vt)
                        out.backward(dot)

                    ms = time_ms(fwd, 2, nn)
                    t.row("attention fwd [%s]" % tag, shape, ms, fwd_flops)
                    ms = time_ms(fwd_bwd, 1, nn)
                    t.row("attention fwd+bwd [%s]" % tag, shape, ms, 3.5 * fwd_flops)
            except Exception as e:  # noqa: BLE001
                print("attention %s %s: skipped (%s)" % (tag, shape, str(e).splitlines()[0]))
            del qg, kg, vg, qt, kt, vt
            torch.cuda.empty_cache()

    attention(1, 4096, 40, 128)
    if not a.quick:
        attention(1, 32760, 40, 128)
    if t.csv:
        t.csv.close()

    if a.ours:
        ours = {}
        with open(a.ours) as f:
            for r in csv.DictReader(f):
                ours[(r["op"], r["shape"])] = r
        torch_rows = {(op, shape): (ms, tf) for op, shape, ms, tf, _ in t.rows}
        print()
        print("side by side (same GPU, same run): TFLOP/s, ratio ours / PyTorch")
        print("%-24s %-22s %9s %9s %9s %9s %7s %7s" % ("op", "shape", "ours", "torch", "cudnn", "flash2",
                                                        "/torch", "/flash2"))
        for (op, shape), r in ours.items():
            o_tf = float(r["tflops"])
            if o_tf == 0:
                continue
            if op.startswith("attention"):
                base = "attention fwd+bwd" if "fwd+bwd" in op else ("attention fwd" if op == "attention fwd" else None)
                if base is None:
                    print("%-24s %-22s %9.1f" % (op, shape, o_tf))
                    continue
                cu = torch_rows.get(("%s [cudnn]" % base, shape))
                fl = torch_rows.get(("%s [flash2]" % base, shape))
                cu_tf = cu[1] if cu else float("nan")
                fl_tf = fl[1] if fl else float("nan")
                best = max(x for x in (cu_tf, fl_tf) if not math.isnan(x)) if (cu or fl) else float("nan")
                print("%-24s %-22s %9.1f %9.1f %9.1f %9.1f %7.2f %7.2f" % (op, shape, o_tf, best, cu_tf, fl_tf,
                                                                          o_tf / best, o_tf / fl_tf))
            else:
                tr = torch_rows.get((op, shape))
                tt = tr[1] if tr else float("nan")
                print("%-24s %-22s %9.1f %9.1f %9s %9s %7.2f" % (op, shape, o_tf, tt, "", "", o_tf / tt))
    return 0


if __name__ == "__main__":
    sys.exit(main())
