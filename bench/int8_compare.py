#!/usr/bin/python3
"""ldlm's int8 denoiser against ldlm bf16, PyTorch quantize_dynamic and PyTorch fp32;
peak RSS of generation at int8 and fp32; the dictionary-word share at int8 and fp32.

Build first: cmake --preset default
             cmake --build build/default --target ldlm_bench ldlm_cli
Then, from the repository root (Debian's python, which has torch 1.13; the dictionary
share needs Debian's wamerican):
    PYTHONPATH=tools:. /usr/bin/python3 bench/int8_compare.py report --build build/default
writes bench/results/int8-<cpu>.md by itself (the CPU from lscpu, the command, the load
average before and after) in about 25 minutes on 2 cores. Its parts alone, printing
markdown on stdout:
    ... int8_compare.py speed [--rounds 3] [--reps 3] [--T 128,256,512,1024]
    ... int8_compare.py rss [--length 1024]
    ... int8_compare.py words
    ... int8_compare.py accuracy [--T 256]

speed: paired rounds; in each, for every thread count and T one after the other:
  ldlm_bench's denoiser_T (bf16) and denoiser_int8_T (ldlm-base denoiser, generator
  weights, B 1), then one PyTorch process per thread count and environment variant of
  bench/compare.py timing fp32 and quantize_dynamic on every engine torch has of onednn
  and fbgemm (median of timed calls; the fastest variant counts). Medians and ranges of
  the times and of the per-round ratios. The report then runs --paired-rounds more
  rounds of the targets' cell alone (T 1024, 1 thread): ldlm int8 and PyTorch int8 on
  its winning variant, one right after the other, in alternating order.
rss: peak RSS (the kernel's maxrss of the one process) of `ldlm generate --length N`
  on ldlm-base generator weights: fp32 and int8 quantized at load (--init-seed), int8
  from a quantized checkpoint that `ldlm quantize` writes first (its size too), and
  int8 quantized at load from an F32 checkpoint (that checkpoint dequantized), as a
  real float checkpoint is read.
words: the built-in demo model at fp32 and int8, seeds 0-7: the dictionary-word share
  (research/train/dictionary.py, the model card's measure) of generations of 64 tokens
  and of the fills of infill (8 masked tokens in each of 4 sentences of
  research/train/modern_english.txt), and the ids' agreement with fp32.
accuracy: every trained module (denoiser, encoder, latent decoder, token decoder) at int8,
  bf16 and fp32 against PyTorch fp32, with quantize_dynamic's error in the same run.
PyTorch's denoiser block calls its attention projections as functions of their weights,
which quantize_dynamic cannot see: here they are called as modules, the same arithmetic.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

from compare import default_variants, ldlm_env, proc_cpu_flags, runnable_variants, torch_env

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCH_ENGINES = ("onednn", "fbgemm")
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")  # set before torch loads


# The trained modules: the name `ldlm forward` takes (the state-dict prefix), the reference
# class, the inputs and the output it names.
MODULES = {
    "denoiser": ("Denoiser", ("x_t", "t", "self_cond"), "x0"),
    "encoder": ("LatentEncoder", ("features",), "latents"),
    "latent_decoder": ("LatentDecoder", ("latents",), "hidden"),
    "token_decoder": ("TokenDecoder", ("hidden",), "logits"),
}


def torch_modules(engines=("onednn",), module="denoiser"):
    """An ldlm-base module in PyTorch fp32 (generator weights, seed 1) and its
    quantize_dynamic copies, one per engine available among `engines`."""
    import copy

    import torch
    from reference import ldlm_init
    from reference import ldlm_torch as lt

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

    fp32 = plain_linears(getattr(lt, MODULES[module][0])(lt.LDLM_BASE).eval())
    ldlm_init.init_module(fp32, module + ".", 1)
    # Every Linear but the latent decoder's ScaleMasks (Linear(1, 1) on the mask indicator,
    # no product in ldlm) and its embedding FFN, which maps the one [d] mask vector:
    # PyTorch's dynamic linear refuses a 1-D input, so those stay fp32 there.
    linears = {name for name, m in fp32.named_modules() if type(m) is torch.nn.Linear and m.in_features > 1
               and not name.startswith("embedding_ffn.")}
    quantized = {}
    for engine in engines:
        if engine not in torch.backends.quantized.supported_engines:
            continue
        torch.backends.quantized.engine = engine
        quantized[engine] = torch.ao.quantization.quantize_dynamic(copy.deepcopy(fp32), linears, dtype=torch.qint8)
    return fp32, quantized


def uniform(*shape, seed):
    import torch
    g = torch.Generator().manual_seed(seed)
    return torch.rand(*shape, generator=g) * 2 - 1


def errors(got, ref):
    diff = (got - ref).double()
    ref = ref.double()
    return float(diff.abs().max() / ref.abs().max()), float(diff.pow(2).mean().sqrt() / ref.pow(2).mean().sqrt())


def cli_path(build: str) -> str:
    return os.path.join(build, "tools", "ldlm")


def clean_env(**extra) -> dict:
    """ldlm as shipped (compare.py's): without ldlm's, oneDNN's and the allocator's switches."""
    env = ldlm_env()
    env.update(extra)
    return env


# ------------------------------------------------------------------------- accuracy
def accuracy(build: str, T: int = 256, threads: int = 2) -> str:
    """Every trained module at fp32, bf16 and int8 against PyTorch fp32, beside quantize_dynamic."""
    import torch
    from reference import ldlm_torch as lt
    from reference.safetensors_io import read_safetensors, write_safetensors

    torch.set_num_threads(threads)
    lines = [f"ldlm-base modules (generator weights, seed 1; B 1, T {T}; inputs uniform in [-1, 1), the "
             "denoiser's t 0.5) against PyTorch fp32. Error: max |error| / max |ref| and RMS error / RMS ref.", "",
             "| module | PyTorch quantize_dynamic (onednn) | ldlm int8 | ldlm bf16 | ldlm fp32 |",
             "|---|---|---|---|---|"]
    for module, (_, input_names, output) in MODULES.items():
        fp32, quantized = torch_modules(module=module)
        inputs = {name: torch.full((1,), 0.5) if name == "t" else uniform(1, T, lt.LDLM_BASE.d_model, seed=1 + n)
                  for n, name in enumerate(input_names)}
        with torch.no_grad():
            ref = fp32(*inputs.values())
            torch.backends.quantized.engine = "onednn"
            cells = [errors(quantized["onednn"](*inputs.values()), ref)]
        with tempfile.TemporaryDirectory(prefix="int8-compare-") as tmp:
            weights, inputs_path = os.path.join(tmp, "w.safetensors"), os.path.join(tmp, "in.safetensors")
            write_safetensors(weights, {f"{module}.{k}": v.contiguous() for k, v in fp32.state_dict().items()})
            write_safetensors(inputs_path, inputs)
            for precision in ("int8", "bf16", "fp32"):
                out = os.path.join(tmp, precision + ".safetensors")
                subprocess.run([cli_path(build), "forward", module, "--weights", weights, "--inputs",
                                inputs_path, "--output", out, "--precision", precision, "--threads",
                                str(threads)], check=True, env=clean_env())
                cells.append(errors(read_safetensors(out)[0][output].reshape(ref.shape), ref))
        lines.append(f"| {module} | " + " | ".join(f"{worst:.2e} / {rms:.2e}" for worst, rms in cells) + " |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------- speed
def ldlm_times(bench: str, T: int, threads: int, reps: int) -> dict:
    """Median ms of ldlm_bench's bf16 and int8 denoiser at (T, threads)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    pattern = f"denoiser_(T/T:{T}/threads:{threads}/bf16:1|int8_T/T:{T}/threads:{threads})/"
    subprocess.run([bench, f"--benchmark_filter={pattern}", f"--benchmark_out={path}",
                    "--benchmark_out_format=json", f"--benchmark_repetitions={reps}"], check=True, env=clean_env(),
                   stdout=subprocess.DEVNULL)
    with open(path) as f:
        data = json.load(f)
    os.unlink(path)
    samples = {}  # the repetitions' times (Google Benchmark reports no aggregates for one)
    for b in data["benchmarks"]:
        if b.get("run_type") == "iteration":
            samples.setdefault("ldlm_int8" if "int8" in b["name"] else "ldlm_bf16", []).append(b["real_time"])
    return {k: statistics.median(v) for k, v in samples.items()}


def torch_worker(args) -> None:
    """Prints {"<model>/<T>": ms, ...} for fp32 and each quantize_dynamic engine."""
    import torch
    torch.set_num_threads(args.threads)
    fp32, quantized = torch_modules(TORCH_ENGINES)
    models = [("torch_fp32", None, fp32)] + [(f"torch_int8_{e}", e, m) for e, m in quantized.items()]
    out = {}
    with torch.no_grad():
        for T in args.T:
            x_t, self_cond, t = uniform(1, T, 768, seed=1), uniform(1, T, 768, seed=2), torch.full((1,), 0.5)
            for name, engine, m in models:
                if engine:
                    torch.backends.quantized.engine = engine
                m(x_t, t, self_cond)
                samples = []
                for _ in range(args.reps):
                    start = time.perf_counter()
                    m(x_t, t, self_cond)
                    samples.append((time.perf_counter() - start) * 1e3)
                out[f"{name}/{T}"] = statistics.median(samples)
    print(json.dumps(out))


def torch_times(variant: str, threads: int, reps: int, Ts: list) -> dict:
    """torch_worker's {"<model>/<T>": ms}, in its own process under bench/compare.py's environment `variant`."""
    env = dict(torch_env(variant), **{v: str(threads) for v in THREAD_VARS})
    res = subprocess.run([sys.executable, os.path.abspath(__file__), "torch-worker", "--threads", str(threads),
                          "--reps", str(reps), "--T", ",".join(map(str, Ts))], check=True, env=env,
                         capture_output=True, text=True)
    return json.loads(res.stdout)


def speed_rounds(args) -> list:
    bench = os.path.join(args.build, "bench", "ldlm_bench")
    flags = proc_cpu_flags()
    variants = runnable_variants(list(default_variants(flags)), flags)
    rounds = []
    for r in range(args.rounds):
        row = {}
        for threads in (1, 2):
            for T in args.T:
                for k, v in ldlm_times(bench, T, threads, args.reps).items():
                    row[f"{k}/{T}/{threads}"] = v
            # PyTorch at its best: every variant of compare.py (allocator, ISA, OpenBLAS core),
            # the fastest per model and T; the ambient environment maps large temporaries.
            for variant in variants:
                for k, v in torch_times(variant, threads, args.reps, args.T).items():
                    key = f"{k}/{threads}"
                    if key not in row or v < row[key]:
                        row[key], row[f"variant:{key}"] = v, variant
        rounds.append(row)
        print(f"round {r + 1}: {json.dumps(row)}", file=sys.stderr, flush=True)
    return rounds


def cell(values):
    return f"{statistics.median(values):.0f} [{min(values):.0f}–{max(values):.0f}]"


def ratio_cell(values):
    return f"{statistics.median(values):.2f} [{min(values):.2f}–{max(values):.2f}]"


def speed_table(rounds: list, Ts: list) -> tuple[str, dict]:
    """The markdown table, and the T-max one-thread ratios the issue's targets name."""
    engines = sorted({k.split("/")[0][len("torch_int8_"):] for k in rounds[0] if k.startswith("torch_int8_")})
    # PyTorch int8 at its best: the faster engine at each (T, threads), per round.
    lines = [f"Denoiser forward (ldlm-base, generator weights, B 1), {len(rounds)} paired rounds; ms and ratios as "
             "median [range] over the rounds. PyTorch int8 is quantize_dynamic on its faster engine at each T "
             f"and thread count (engines available: {', '.join(engines) or 'none'}); each PyTorch figure is the "
             "fastest of bench/compare.py's environment variants (listed below with the winners), as compare.py "
             "measures PyTorch at its best.", "",
             "| T | threads | ldlm int8 | ldlm bf16 | PyTorch int8 | PyTorch fp32 | ldlm bf16 / int8 | "
             "PyTorch int8 / ldlm int8 | PyTorch fp32 / ldlm int8 |", "|---|---|---|---|---|---|---|---|---|"]
    engine_lines = ["| T | threads | " + " | ".join(f"PyTorch int8 {e}" for e in engines) +
                    " | fastest variant by round, fp32 | int8 |", "|---|---|" + "---|" * (len(engines) + 2)]
    targets = {}
    for threads in (1, 2):
        for T in Ts:
            get = lambda k: [row[f"{k}/{T}/{threads}"] for row in rounds]  # noqa: E731
            i8, bf, tf = get("ldlm_int8"), get("ldlm_bf16"), get("torch_fp32")
            per_engine = {e: get(f"torch_int8_{e}") for e in engines}
            ti8 = [min(per_engine[e][i] for e in engines) for i in range(len(rounds))]
            bf_ratio = [b / i for b, i in zip(bf, i8)]
            ti8_ratio = [p / i for p, i in zip(ti8, i8)]
            lines.append(f"| {T} | {threads} | {cell(i8)} | {cell(bf)} | {cell(ti8)} | {cell(tf)} | "
                         f"{ratio_cell(bf_ratio)} | {ratio_cell(ti8_ratio)} | "
                         f"{ratio_cell([p / i for p, i in zip(tf, i8)])} |")
            winners = lambda k: ", ".join(row.get(f"variant:{k}/{T}/{threads}", "?") for row in rounds)  # noqa: E731
            engine_lines.append(f"| {T} | {threads} | " + " | ".join(cell(per_engine[e]) for e in engines) +
                                f" | {winners('torch_fp32')} | " +
                                " / ".join(winners(f"torch_int8_{e}") for e in engines) + " |")
            if threads == 1 and T == max(Ts):
                targets = {"T": T, "bf16_over_int8": statistics.median(bf_ratio),
                           "torch_int8_over_int8": statistics.median(ti8_ratio)}
    text = "\n".join(lines) + "\n\nPyTorch quantize_dynamic by engine (ms), and the fastest variant:\n\n" + "\n".join(engine_lines) + "\n"
    return text, targets


def paired_target_rounds(args, rounds: list) -> list:
    """--paired-rounds N: N more rounds at the targets' cell (the largest T, 1 thread), each an ldlm int8 run and
    a PyTorch run on the variant that won that cell's int8 most often in the main rounds, one right after the
    other, in alternating order. Returns each round's PyTorch int8 / ldlm int8. The main rounds pair runs that
    are minutes apart, and on a shared host the clock moves that much from one minute to the next: PyTorch int8
    alone read 1063 and 1198 ms at T 1024 two minutes apart (bench/results/README.md, "the arena's second call")."""
    T = max(args.T)
    bench = os.path.join(args.build, "bench", "ldlm_bench")
    winners = [row.get(f"variant:torch_int8_{e}/{T}/1") for row in rounds for e in TORCH_ENGINES]
    winners = [w for w in winners if w]
    variant = max(set(winners), key=winners.count)

    def run_ldlm():
        return ldlm_times(bench, T, 1, args.reps)["ldlm_int8"]

    def run_torch():
        return min(v for k, v in torch_times(variant, 1, args.reps, [T]).items() if k.startswith("torch_int8_"))

    ratios = []
    for r in range(args.paired_rounds):
        if r % 2 == 0:
            ours, theirs = run_ldlm(), run_torch()
        else:
            theirs = run_torch()
            ours = run_ldlm()
        ratios.append(theirs / ours)
        print(f"paired round {r + 1} ({variant}): ldlm {ours:.0f} ms, PyTorch int8 {theirs:.0f} ms",
              file=sys.stderr, flush=True)
    return ratios


def speed(args) -> str:
    rounds = speed_rounds(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rounds, f, indent=1)
    return speed_table(rounds, args.T)[0]


# ------------------------------------------------------------------------- rss
def peak_rss_mb(cmd: list) -> float:
    """The peak resident set of one process running cmd, in MB (its own maxrss, from wait4)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=clean_env())
    _, status, usage = os.wait4(proc.pid, 0)
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err}")
    return usage.ru_maxrss / 1024.0


def rss(args) -> tuple[str, dict]:
    cli = cli_path(args.build)
    with tempfile.TemporaryDirectory(prefix="int8-compare-") as tmp:
        quantized = os.path.join(tmp, "ldlm-base-int8.safetensors")
        start = time.perf_counter()
        subprocess.run([cli, "quantize", quantized, "--init-seed", "7"], check=True, env=clean_env(),
                       stdout=subprocess.DEVNULL)
        quantize_s = time.perf_counter() - start
        size_mb = os.path.getsize(quantized) / 1e6
        float_file = os.path.join(tmp, "ldlm-base-f32.safetensors")
        # In a process of its own: a child's maxrss starts from its parent's resident set
        # at the fork, and this one would hold the dequantized tensors (3 GB).
        subprocess.run([sys.executable, os.path.abspath(__file__), "dequantize-worker", quantized, float_file],
                       check=True, env=dict(os.environ, PYTHONPATH=os.path.join(REPO, "tools")))
        common = ["generate", "--length", str(args.length), "--steps", str(args.steps), "--threads", "2", "--ids"]
        runs = [("fp32, generator weights (--init-seed 7)", [cli] + common + ["--init-seed", "7"]),
                ("int8 quantized at load (--init-seed 7)", [cli] + common + ["--init-seed", "7", "--precision", "int8"]),
                ("int8 from the quantized checkpoint", [cli] + common + ["--weights", quantized, "--precision", "int8"]),
                ("int8 quantized at load from an F32 checkpoint",
                 [cli] + common + ["--weights", float_file, "--precision", "int8"])]
        results = [(name, peak_rss_mb(cmd)) for name, cmd in runs]
    fp32 = results[0][1]
    lines = [f"Peak RSS of `ldlm generate --length {args.length} --steps {args.steps} --threads 2` on ldlm-base "
             "generator weights (the process's maxrss):", "", "| model | peak RSS | / fp32 |", "|---|---|---|"]
    lines += [f"| {name} | {mb:.0f} MB | {mb / fp32:.3f} |" for name, mb in results]
    lines += ["", f"The quantized checkpoint (`ldlm quantize OUT --init-seed 7`, {quantize_s:.0f} s): "
              f"{size_mb:.0f} MB (the feature model generated from its seed, not stored)."]
    return "\n".join(lines) + "\n", {"rss_ratio_file": results[2][1] / fp32, "rss_ratio_load": results[1][1] / fp32,
                                      "rss_ratio_float_file": results[3][1] / fp32, "size_mb": size_mb}


def write_dequantized(quantized: str, out: str) -> None:
    """An F32 checkpoint of the quantized one's model: each I8 weight times its scales,
    every other tensor widened, the metadata kept but for 'ldlm.quantization'."""
    import torch
    from reference.safetensors_io import read_safetensors, write_safetensors
    tensors, metadata = read_safetensors(quantized)
    scales = {name + ".scale" for name, t in tensors.items() if t.dtype == torch.int8}
    values = {}
    for name, t in tensors.items():
        if t.dtype == torch.int8:
            values[name] = t.to(torch.float32) * tensors[name + ".scale"].to(torch.float32)[:, None]
        elif name not in scales:
            values[name] = t.to(torch.float32)
    metadata = {k: v for k, v in (metadata or {}).items() if k != "ldlm.quantization"}
    write_safetensors(out, values, metadata)


# ------------------------------------------------------------------------- words
def infill_texts() -> list[tuple[str, str]]:
    """(prefix, suffix) of 4 sentences of modern_english.txt: the first three words and
    the last two are kept, 8 tokens between them are masked."""
    with open(os.path.join(REPO, "research", "train", "modern_english.txt"), encoding="utf-8") as f:
        lines = [line.strip() for line in f if len(line.split()) >= 10]
    out = []
    for line in lines[:4]:
        words = line.split()
        out.append((" ".join(words[:3]), " " + " ".join(words[-2:])))
    return out


def words(args) -> tuple[str, dict]:
    from research.train.dictionary import dictionary_share, load_dictionary

    vocabulary = load_dictionary()
    if vocabulary is None:
        return "The dictionary-word share needs /usr/share/dict/words (apt-get install wamerican): not measured.\n", {}
    cli = cli_path(args.build)
    seeds = range(8)
    result = {}
    for precision in ("fp32", "int8"):
        common = ["--precision", precision, "--threads", "2"]
        texts, ids, fills = [], [], []
        for seed in seeds:
            run = lambda extra: subprocess.run([cli] + extra + common + ["--seed", str(seed)], check=True,  # noqa
                                               env=clean_env(), capture_output=True, text=True).stdout
            ids.append(run(["generate", "--length", "64", "--ids"]).split())
            # (GPT-2's 50257 ids; the model's pad and mask ids above them have no text)
            texts.append(subprocess.run([cli, "detokenize", "--ids", " ".join(i for i in ids[-1] if int(i) < 50257)],
                                        check=True, env=clean_env(), capture_output=True, text=True).stdout)
            for prefix, suffix in infill_texts():
                out = run(["infill", "--text", prefix + "<|mask|>" * 8 + suffix]).rstrip("\n")
                fill = out[len(prefix):len(out) - len(suffix)] if out.startswith(prefix) and out.endswith(suffix) \
                    else out
                fills.append(fill)
        result[precision] = {"generate": dictionary_share(texts, vocabulary),
                             "infill": dictionary_share(fills, vocabulary), "ids": ids}
    agree = sum(a == b for s8, s32 in zip(result["int8"]["ids"], result["fp32"]["ids"]) for a, b in zip(s8, s32))
    total = sum(len(s) for s in result["fp32"]["ids"])
    lines = ["Built-in demo model, default sampler, seeds 0-7: the dictionary-word share "
             "(research/train/dictionary.py) of 8 generations of 64 tokens and of the 32 fills of infill "
             "(8 masked tokens between the first three and the last two words of 4 sentences of "
             "research/train/modern_english.txt):", "", "| | fp32 | int8 |", "|---|---|---|",
             f"| generate, 64 tokens | {result['fp32']['generate']:.3f} | {result['int8']['generate']:.3f} |",
             f"| infill fills | {result['fp32']['infill']:.3f} | {result['int8']['infill']:.3f} |", "",
             f"Generated ids equal to fp32's: {agree} / {total} = {agree / max(1, total):.3f}."]
    return "\n".join(lines) + "\n", {"agreement": agree / max(1, total)}


# ------------------------------------------------------------------------- report
def lscpu() -> dict:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, env=dict(os.environ, LC_ALL="C")).stdout
    fields = {}
    for line in out.splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def cpu_slug(fields: dict) -> str:
    name = fields.get("Model name", platform.processor() or "cpu")
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return f"{slug}-family{fields.get('CPU family', '')}-model{fields.get('Model', '')}"


def report(args) -> None:
    started = time.time()
    load_before = os.getloadavg()
    fields = lscpu()
    info = subprocess.run([cli_path(args.build), "info"], capture_output=True, text=True, env=clean_env()).stdout
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    import torch
    rounds = speed_rounds(args)
    speed_text, targets = speed_table(rounds, args.T)
    paired = paired_target_rounds(args, rounds) if args.paired_rounds else []
    rss_text, rss_figures = rss(args)
    words_text, words_figures = words(args)
    accuracy_text = accuracy(args.build)
    load_after = os.getloadavg()
    minutes = (time.time() - started) / 60
    flags = set(fields.get("Flags", "").split())
    wanted = ["avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_int8", "amx_bf16"]
    command = "PYTHONPATH=tools:. /usr/bin/python3 bench/int8_compare.py " + " ".join(sys.argv[1:])

    def met(value, ok, digits=2):
        return f"{value:.{digits}f}, **{'met' if ok else 'missed'}**"

    lines = [f"# int8 against bf16, PyTorch int8 and fp32 on {fields.get('Model name', 'this CPU')}", "",
             f"Written by `{command}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}, "
             f"commit {commit}, in {minutes:.1f} minutes.", "",
             f"- CPU (`lscpu`): {fields.get('Model name', '?')}, family {fields.get('CPU family', '?')}, model "
             f"{fields.get('Model', '?')}, {fields.get('CPU(s)', '?')} CPUs; "
             f"{', '.join(f for f in wanted if f in flags) or 'none of AVX-512, VNNI, AMX'}",
             f"- load average (1, 5, 15 min) before: {' / '.join(f'{x:.2f}' for x in load_before)}; after: "
             f"{' / '.join(f'{x:.2f}' for x in load_after)}",
             f"- torch {torch.__version__}, quantized engines {', '.join(torch.backends.quantized.supported_engines)}",
             "- `ldlm info`:", "", "```", info.rstrip(), "```", "",
             "## Targets (issue 38, T = " + str(targets.get("T", "?")) + ", 1 thread)", "",
             f"- ldlm int8 ≥ 1.5x ldlm bf16: {met(targets['bf16_over_int8'], targets['bf16_over_int8'] >= 1.5)}",
             f"- ldlm int8 ≥ 2.5x PyTorch int8: "
             f"{met(targets['torch_int8_over_int8'], targets['torch_int8_over_int8'] >= 2.5)} (the main rounds)"
             + (f"; {met(statistics.median(paired), statistics.median(paired) >= 2.5)} [{min(paired):.2f}–"
                f"{max(paired):.2f}] as the median of {len(paired)} rounds paired run by run (`--paired-rounds`)"
                if paired else ""),
             f"- peak RSS of generate at int8 ≤ 0.35x fp32's, from a quantized checkpoint: "
             f"{met(rss_figures['rss_ratio_file'], rss_figures['rss_ratio_file'] <= 0.35, 3)}; quantized at load: "
             f"{rss_figures['rss_ratio_load']:.3f} (generator weights), {rss_figures['rss_ratio_float_file']:.3f} "
             "(an F32 checkpoint)", "",
             "## Speed", "", speed_text, "## Peak RSS", "", rss_text, "## Dictionary-word share", "", words_text,
             "## Accuracy per module", "", accuracy_text]
    path = args.out or os.path.join(REPO, "bench", "results", f"int8-{cpu_slug(fields)}.md")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    print(f"wrote {path} in {minutes:.1f} minutes", file=sys.stderr)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    Ts = lambda v: [int(x) for x in v.split(",")]  # noqa: E731
    parsers = {name: sub.add_parser(name) for name in ("report", "speed", "rss", "words", "accuracy")}
    for name, s in parsers.items():
        s.add_argument("--build", default=os.path.join(REPO, "build", "default"))
    for name in ("report", "speed"):
        parsers[name].add_argument("--rounds", type=int, default=3)
        parsers[name].add_argument("--reps", type=int, default=3)
        parsers[name].add_argument("--T", type=Ts, default=[128, 256, 512, 1024])
    parsers["report"].add_argument("--paired-rounds", type=int, default=5,
                                   help="rounds of the targets' cell alone, ldlm and PyTorch run by run (0: none)")
    parsers["speed"].add_argument("--json", help="also write every round's figures here")
    parsers["report"].add_argument("--out", help="the report's path; default bench/results/int8-<cpu>.md")
    for name in ("report", "rss"):
        parsers[name].add_argument("--length", type=int, default=1024)
        parsers[name].add_argument("--steps", type=int, default=2,
                                   help="solver steps (the sampler's peak comes by its third call: at 10 steps "
                                        "int8's peak was 3 MB higher and fp32's the same)")
    parsers["accuracy"].add_argument("--T", type=int, default=256)
    parsers["accuracy"].add_argument("--threads", type=int, default=2)
    w = sub.add_parser("torch-worker")
    w.add_argument("--threads", type=int, required=True)
    w.add_argument("--reps", type=int, default=3)
    w.add_argument("--T", type=Ts, required=True)
    d = sub.add_parser("dequantize-worker")
    d.add_argument("quantized")
    d.add_argument("out")
    args = p.parse_args()
    if args.command == "torch-worker":
        return torch_worker(args)
    if args.command == "dequantize-worker":
        return write_dequantized(args.quantized, args.out)
    if args.command == "report":
        return report(args)
    out = {"speed": speed, "accuracy": lambda a: accuracy(a.build, a.T, a.threads), "rss": lambda a: rss(a)[0], "words": lambda a: words(a)[0]}
    print(out[args.command](args), end="")


if __name__ == "__main__":
    main()
