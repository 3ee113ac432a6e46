#!/usr/bin/env python3
"""Render the sampler measurement of research/sampler_eval.cpp (ldlm_sampler_eval) as
research/results/samplers-<cpu>.md with a log-log plot of error against denoiser calls.

  PYTHONPATH=tools python3 -m research.samplers RESULTS.json --out research/results/samplers-amd-epyc-zen5

Adds the dictionary-word share of the stochastic samplers' texts (the model card's
measure, /usr/share/dict/words from Debian's wamerican) when the JSON carries texts.
"""
import argparse
import json
import os
import sys

from .train.dictionary import dictionary_share, load_dictionary


def self_condition(run):
    # Results written before the option existed conditioned every call on the previous x̂0.
    return run.get("self_condition", "previous")


def plot(runs, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    lines = {}
    for r in runs:
        if r["heun_self_condition"] == "latest" and r["grid"] in ("uniform", "karras"):
            lines.setdefault((r["sampler"], r["grid"], self_condition(r)), []).append(r)
    samplers = sorted({k[0] for k in lines})
    colors = {name: plt.cm.tab10(i % 10) for i, name in enumerate(samplers)}
    for (sampler, grid, sc), rows in sorted(lines.items()):
        rows.sort(key=lambda r: r["calls"])
        style = ":" if sc == "extrapolated" else "--" if grid == "uniform" else "-"
        label = f"{sampler} ({grid}" + (", self-cond extrapolated)" if sc == "extrapolated" else ")")
        for ax, value in zip(axes, [lambda r: r["rmse_sample"], lambda r: max(1 - r["agreement_sample"], 1e-3)]):
            ax.plot([r["calls"] for r in rows], [value(r) for r in rows], style, color=colors[sampler], marker="o",
                    ms=3, label=label)
    for ax, what in zip(axes, ["latent RMSE at t_min", "share of token ids that differ"]):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("denoiser calls (NFE)")
        ax.set_ylabel(what)
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=7, ncol=2)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results")
    ap.add_argument("--out", required=True, help="path without extension: writes .md, .png and .json")
    a = ap.parse_args()
    with open(a.results) as f:
        data = json.load(f)
    meta, runs = data["meta"], data["runs"]
    words = load_dictionary()
    for r in runs:
        texts = r.pop("texts_denoised_sample", None)
        if texts and words:
            r["dictionary_denoised"] = dictionary_share(texts[0::2], words)
            r["dictionary_sample"] = dictionary_share(texts[1::2], words)
    refs = data["reference"]
    title = (f"{meta['model']}, T = {meta['length']}, {meta['seeds']} seeds, reference dpmpp-2m "
             f"{meta['reference_steps']} steps; {meta['cpu']} (family {meta['cpu_family']}, model {meta['cpu_model']})")
    out = [f"# Sampling quality per denoiser call", "", title, "",
           "Written by `research/samplers.py` from `ldlm_sampler_eval` (research/sampler_eval.cpp); "
           "the protocol is in docs/model.md §Choosing the default.", ""]
    agree = min(r["agreement_n_2n_sample"] for r in refs)
    agree_d = min(r["agreement_n_2n_denoised"] for r in refs)
    e_agree = min(r["euler_agreement_n_2n_sample"] for r in refs)
    e_vs = sum(r["euler_vs_exact_agreement_sample"] for r in refs) / len(refs)
    out += [f"- **The reference has converged:** N = {meta['reference_steps']} and 2N steps agree on "
            f"{agree:.4f} of ids at x(t_min) and {agree_d:.4f} at the last x̂0 (worst seed); Euler's own ODE "
            f"reference: {e_agree:.4f}.",
            f"- Euler's clipped-β ODE converges elsewhere: its reference agrees with the exact ODE's on "
            f"{e_vs:.3f} of ids. Euler rows are scored against their own reference; `exact` columns score "
            f"every row against the exact ODE.",
            f"- One denoiser call: {sum(r['seconds_per_call'] for r in refs) / len(refs) * 1e3:.2f} ms.", ""]
    out += ["## Token agreement at x(t_min) (endpoint `sample`), by denoiser calls", ""]
    calls = sorted({r["calls"] for r in runs})
    keys = []
    for r in runs:
        k = (r["sampler"], r["grid"], r["heun_self_condition"], self_condition(r))
        if k not in keys:
            keys.append(k)
    by = {(r["sampler"], r["grid"], r["heun_self_condition"], self_condition(r), r["calls"]): r for r in runs}

    def table(field, fmt):
        lines = ["| sampler | grid | " + " | ".join(str(c) for c in calls) + " |",
                 "|---|---|" + "---|" * len(calls)]
        for k in keys:
            name = k[0] + (" (self-cond: step start)" if k[2] == "step_start" else "")
            name += " (self-cond: extrapolated)" if k[3] == "extrapolated" else ""
            cells = [fmt.format(by[k + (c,)][field]) if k + (c,) in by else "" for c in calls]
            lines.append(f"| {name} | {k[1]} | " + " | ".join(cells) + " |")
        return lines

    out += table("agreement_sample", "{:.3f}") + [""]
    out += ["## Token agreement at the last x̂0 (endpoint `denoised`)", ""] + table("agreement_denoised", "{:.3f}")
    out += ["", "## Latent RMSE at x(t_min)", ""] + table("rmse_sample", "{:.4f}")
    out += ["", "## Sampler overhead: share of a run's time outside the denoiser", ""] + table("solver_share", "{:.4f}")
    if any("dictionary_sample" in r for r in runs):
        out += ["", "## Dictionary-word share of the decoded texts (x(t_min) / last x̂0)", ""]
        lines = table("dictionary_sample", "{:.3f}")
        out += lines
        out += ["", "Last x̂0:", ""] + table("dictionary_denoised", "{:.3f}")
        out += ["", "## Distinct samples (of the seeds, last x̂0)", ""] + table("distinct_denoised", "{}")
    png = a.out + ".png"
    plot(runs, png, title)
    out += ["", f"![error against denoiser calls]({os.path.basename(png)})", ""]
    with open(a.out + ".md", "w") as f:
        f.write("\n".join(out))
    with open(a.out + ".json", "w") as f:
        json.dump(data, f, indent=1)
    print(f"wrote {a.out}.md, .png and .json")


if __name__ == "__main__":
    sys.exit(main())
