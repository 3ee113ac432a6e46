#!/usr/bin/python3
"""ldlm's int8 denoiser against ldlm bf16, PyTorch quantize_dynamic and PyTorch fp32.

Build first: cmake --preset default
             cmake --build build/default --target ldlm_bench ldlm_cli
Then (Debian's python, which has torch 1.13):
    /usr/bin/python3 bench/int8_compare.py accuracy --build build/default [--T 256]
    /usr/bin/python3 bench/int8_compare.py speed --build build/default [--rounds 3] [--T 128,256,512,1024]

accuracy: the ldlm-base denoiser with generator weights (tools/reference/ldlm_init.py,
  seed 1) on uniform inputs in [-1, 1): PyTorch fp32 (the reference), PyTorch
  quantize_dynamic (onednn engine, every Linear quantized, in the same run), and
  `ldlm forward denoiser` at --precision fp32, bf16 and int8 on the same weights and
  inputs. Prints max|err| / max|ref| and the RMS error / RMS of the reference.
speed: paired rounds; in each, for every T and thread count one after the other:
  ldlm_bench's denoiser_T (bf16) and denoiser_int8_T, then PyTorch fp32 and
  quantize_dynamic (median of timed calls). Medians and ranges of the times and of the
  per-round ratios.
Both print markdown on stdout. PyTorch's denoiser block calls its attention
projections as functions of their weights, which quantize_dynamic cannot see: here
they are called as modules, the same arithmetic in fp32.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools", "reference"))


def torch_modules():
    import torch
    import ldlm_init
    import ldlm_torch as lt

    def block_forward(self, x, c):  # attention projections as modules, for quantize_dynamic
        cfg, d = self.cfg, self.cfg.d_model
        mod = self.adaLN_modulation(c)[:, None]
        shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = mod.chunk(6, dim=-1)
        y = lt.modulate(self.norm1(x), shift_a, scale_a)
        q, k, v = self.attn_qkv(y).split(d, dim=-1)
        q, k, v = lt.split_heads(q, cfg.n_heads), lt.split_heads(k, cfg.n_heads), lt.split_heads(v, cfg.n_heads)
        q = lt.apply_rotary(q, cfg.rope_base, cfg.rotary_interleaved)
        k = lt.apply_rotary(k, cfg.rope_base, cfg.rotary_interleaved)
        a = lt.attention(q, k, v, softcap=cfg.softcap)
        x = x + gate_a * self.attn_out(lt.merge_heads(a))
        return x + gate_m * self.mlp(lt.modulate(self.norm2(x), shift_m, scale_m))

    lt.DenoiserBlock.forward = block_forward

    def plain_linears(module):  # lt.Linear -> nn.Linear, the type quantize_dynamic maps
        for name, child in module.named_children():
            if isinstance(child, torch.nn.Linear) and type(child) is not torch.nn.Linear:
                plain = torch.nn.Linear(child.in_features, child.out_features, bias=child.bias is not None)
                plain.load_state_dict(child.state_dict())
                setattr(module, name, plain)
            else:
                plain_linears(child)
        return module

    fp32 = plain_linears(lt.Denoiser(lt.LDLM_BASE).eval())
    ldlm_init.init_module(fp32, "", 1)
    torch.backends.quantized.engine = "onednn"
    import copy
    int8 = torch.ao.quantization.quantize_dynamic(copy.deepcopy(fp32), {torch.nn.Linear}, dtype=torch.qint8)
    return fp32, int8


def uniform(*shape, seed):
    import torch
    g = torch.Generator().manual_seed(seed)
    return torch.rand(*shape, generator=g) * 2 - 1


def errors(got, ref):
    diff = (got - ref).double()
    ref = ref.double()
    return float(diff.abs().max() / ref.abs().max()), float(diff.pow(2).mean().sqrt() / ref.pow(2).mean().sqrt())


def accuracy(args) -> None:
    import torch
    from safetensors_io import read_safetensors, write_safetensors

    torch.set_num_threads(args.threads)
    fp32, int8 = torch_modules()
    d = fp32.cfg.d_model
    x_t, self_cond, t = uniform(1, args.T, d, seed=1), uniform(1, args.T, d, seed=2), torch.full((1,), 0.5)
    with torch.no_grad():
        ref = fp32(x_t, t, self_cond)
        rows = [("PyTorch quantize_dynamic (onednn)", errors(int8(x_t, t, self_cond), ref))]
    with tempfile.TemporaryDirectory(prefix="wip-int8-") as tmp:
        weights, inputs = os.path.join(tmp, "w.safetensors"), os.path.join(tmp, "in.safetensors")
        write_safetensors(weights, {"denoiser." + k: v.contiguous() for k, v in fp32.state_dict().items()})
        write_safetensors(inputs, {"x_t": x_t, "t": t, "self_cond": self_cond})
        cli = os.path.join(args.build, "tools", "ldlm")
        for precision in ("fp32", "bf16", "int8"):
            out = os.path.join(tmp, precision + ".safetensors")
            subprocess.run([cli, "forward", "denoiser", "--weights", weights, "--inputs", inputs, "--output", out,
                            "--precision", precision, "--threads", str(args.threads)], check=True)
            got = read_safetensors(out)[0]["x0"]
            rows.append((f"ldlm {precision}", errors(got.reshape(ref.shape), ref)))
    print(f"Denoiser (ldlm-base, generator weights seed 1, B 1, T {args.T}, t 0.5, inputs uniform in [-1, 1)) "
          "against PyTorch fp32:\n")
    print("| | max abs error / max abs ref | RMS error / RMS ref |\n|---|---|---|")
    for name, (worst, rms) in rows:
        print(f"| {name} | {worst:.2e} | {rms:.2e} |")


def ldlm_times(bench: str, T: int, threads: int, reps: int) -> dict:
    """Median ms of ldlm_bench's bf16 and int8 denoiser at (T, threads)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    pattern = f"denoiser_(T/T:{T}/threads:{threads}/bf16:1|int8_T/T:{T}/threads:{threads})/"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LDLM_", "ONEDNN_", "DNNL_"))}
    subprocess.run([bench, f"--benchmark_filter={pattern}", f"--benchmark_out={path}",
                    "--benchmark_out_format=json", f"--benchmark_repetitions={reps}",
                    "--benchmark_report_aggregates_only=true"], check=True, env=env, stdout=subprocess.DEVNULL)
    with open(path) as f:
        data = json.load(f)
    os.unlink(path)
    out = {}
    for b in data["benchmarks"]:
        if b.get("aggregate_name") == "median":
            out["int8" if "int8" in b["name"] else "bf16"] = b["real_time"]
    return out


def torch_worker(args) -> None:
    import torch
    torch.set_num_threads(args.threads)
    fp32, int8 = torch_modules()
    out = {}
    with torch.no_grad():
        for T in args.T:
            x_t, self_cond, t = uniform(1, T, 768, seed=1), uniform(1, T, 768, seed=2), torch.full((1,), 0.5)
            for name, m in (("torch_fp32", fp32), ("torch_int8", int8)):
                m(x_t, t, self_cond)
                samples = []
                for _ in range(args.reps):
                    start = time.perf_counter()
                    m(x_t, t, self_cond)
                    samples.append((time.perf_counter() - start) * 1e3)
                out[f"{name}/{T}"] = statistics.median(samples)
    print(json.dumps(out))


def speed(args) -> None:
    bench = os.path.join(args.build, "bench", "ldlm_bench")
    rounds = []
    for r in range(args.rounds):
        row = {}
        for threads in (1, 2):
            for T in args.T:
                for k, v in ldlm_times(bench, T, threads, args.reps).items():
                    row[f"{k}/{T}/{threads}"] = v
            env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
            res = subprocess.run([sys.executable, __file__, "torch-worker", "--threads", str(threads), "--reps",
                                  str(args.reps), "--T", ",".join(map(str, args.T))],
                                 check=True, env=env, capture_output=True, text=True)
            for k, v in json.loads(res.stdout).items():
                row[f"{k}/{threads}"] = v
        rounds.append(row)
        print(f"round {r + 1}: {json.dumps(row)}", file=sys.stderr, flush=True)
    print(f"Denoiser forward (ldlm-base, B 1), {args.rounds} paired rounds, medians [ranges] of ms and of the "
          "per-round ratios:\n")
    print("| T | threads | ldlm int8 | ldlm bf16 | PyTorch int8 | PyTorch fp32 | bf16 / int8 | PyTorch int8 / "
          "ldlm int8 | PyTorch fp32 / ldlm int8 |\n|---|---|---|---|---|---|---|---|---|")

    def cell(values):
        return f"{statistics.median(values):.1f} [{min(values):.1f}–{max(values):.1f}]"

    def ratio(values):
        return f"{statistics.median(values):.2f} [{min(values):.2f}–{max(values):.2f}]"

    for threads in (1, 2):
        for T in args.T:
            get = lambda k: [row[f"{k}/{T}/{threads}"] for row in rounds]  # noqa: E731
            i8, bf, ti8, tf = get("int8"), get("bf16"), get("torch_int8"), get("torch_fp32")
            print(f"| {T} | {threads} | {cell(i8)} | {cell(bf)} | {cell(ti8)} | {cell(tf)} | "
                  f"{ratio([b / i for b, i in zip(bf, i8)])} | {ratio([p / i for p, i in zip(ti8, i8)])} | "
                  f"{ratio([p / i for p, i in zip(tf, i8)])} |")
    with open(args.json, "w") as f:
        json.dump(rounds, f, indent=1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("accuracy")
    a.add_argument("--build", default=os.path.join(REPO, "build", "default"))
    a.add_argument("--T", type=int, default=256)
    a.add_argument("--threads", type=int, default=2)
    s = sub.add_parser("speed")
    s.add_argument("--build", default=os.path.join(REPO, "build", "default"))
    s.add_argument("--rounds", type=int, default=3)
    s.add_argument("--reps", type=int, default=3)
    s.add_argument("--T", type=lambda v: [int(x) for x in v.split(",")], default=[128, 256, 512, 1024])
    s.add_argument("--json", default=os.path.join(tempfile.gettempdir(), "int8_compare.json"))
    w = sub.add_parser("torch-worker")
    w.add_argument("--threads", type=int, required=True)
    w.add_argument("--reps", type=int, default=3)
    w.add_argument("--T", type=lambda v: [int(x) for x in v.split(",")], required=True)
    args = p.parse_args()
    {"accuracy": accuracy, "speed": speed, "torch-worker": torch_worker}[args.command](args)


if __name__ == "__main__":
    main()
