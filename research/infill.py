#!/usr/bin/env python3
"""Infill and prompt continuation with known tokens (docs/model.md §Conditioning):
the sentences for research/infill_eval.cpp (ldlm_infill_eval) and the report of its results.

  PYTHONPATH=tools python3 -m research.infill sentences --data build/train-data --out build/infill/sentences.tsv
  cmake --build build/default --target ldlm_infill_eval
  build/default/research/ldlm_infill_eval --sentences build/infill/sentences.tsv --output build/infill/raw.json
  PYTHONPATH=tools python3 -m research.infill render build/infill/raw.json --out research/results/infill-amd-epyc-zen5
  PYTHONPATH=tools /usr/bin/python3 -m research.infill bigram build/infill/raw.json --data build/train-data --out research/results/infill-bigram

`sentences` writes the candidates, "source<TAB>key<TAB>text" per line: of each held-out
document of research/train/prepare_data.py's corpus (build/train-data/docs.jsonl), its first
sentence that is plain ASCII prose of 6 to 40 words ending in . ! or ?; each source's in the
order of FNV-1a-64(source, key) (prepare_data.py's hash), then every line of
research/train/modern_english.txt in file order. ldlm_infill_eval tokenizes them and keeps the
first --per-source of each source that fit.

`bigram` scores the one-word task with a bigram model of the training stream (a reference
point for exact recovery: what the corpus's word statistics alone give), to <out>.md.

`render` writes <out>.md and <out>.json (the figures, without the per-sentence fills): exact
recovery of the masked tokens, the dictionary-word share of the fills (the model card's
measure, research/train/dictionary.py), consistency of the known positions, cost in denoiser
calls and time.
"""
import argparse
import json
import os
import re
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
from .train.dictionary import dictionary_share, is_whole_word, load_dictionary

MODERN = os.path.join(HERE, "train", "modern_english.txt")
TASKS = ["word", "span3", "span8"]
TASK_NAMES = {"word": "one word", "span3": "3 tokens", "span8": "8 tokens"}


# ------------------------------------------------------------------------- sentences
def split_sentences(text):
    flat = re.sub(r"\s+", " ", text).strip()
    return re.split(r"(?<=[.!?])\s+(?=[A-Z\"'(])", flat)


def is_plain_sentence(s):
    words = s.split()
    if not 6 <= len(words) <= 40 or s[-1] not in ".!?" or not s.isascii() or not s.isprintable():
        return False
    letters = sum(ch.isalpha() or ch == " " for ch in s)
    return letters / len(s) > 0.85


def write_sentences(data_dir, out_path):
    from .train.prepare_data import fnv1a64  # imports the training stack; only needed here

    per_source = {}
    with open(os.path.join(data_dir, "docs.jsonl"), encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            if d["split"] != "heldout":
                continue
            for i, s in enumerate(split_sentences(d["text"])):
                if is_plain_sentence(s):  # the document's first such sentence only
                    per_source.setdefault(d["source"], []).append((fnv1a64(f"{d['source']}\0{d['key']}"),
                                                                   f"{d['key']}#{i}", s))
                    break
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    with open(out_path, "w", encoding="utf-8") as out:
        for source in sorted(per_source):
            for _, key, s in sorted(per_source[source]):
                out.write(f"{source}\t{key}\t{s}\n")
        with open(MODERN, encoding="utf-8") as f:
            for i, line in enumerate(x.strip() for x in f):
                if line:
                    out.write(f"modern\tline {i + 1}\t{line}\n")
    print(f"wrote {out_path}: " + ", ".join(f"{k} {len(v)}" for k, v in sorted(per_source.items())) + ", modern")


# ---------------------------------------------------------------------------- render
def mean(values):
    values = list(values)
    return sum(values) / max(1, len(values))


def score(rows, words):
    """The figures of the seeds of one configuration (rows of one kind, task and settings)."""
    fills = [f for r in rows for f in r["fills"]]
    out = {"seeds": len(rows), "exact": mean(e for r in rows for e in r["exact"]),
           "dictionary_share": dictionary_share(fills, words),
           "whole_words": mean(is_whole_word(f, words) for f in fills),
           "calls": rows[0]["calls"], "seconds": mean(r["seconds"] for r in rows)}
    if "known_total" in rows[0]:
        out["consistency_tokens"] = sum(r["known_agree"] for r in rows) / sum(r["known_total"] for r in rows)
        out["consistency_sentences"] = mean(r["consistent_sentences"] / len(r["fills"]) for r in rows)
    return out


SETTINGS = ["method", "fill", "from_t", "resample", "sampler", "steps"]


def group(runs, kind):
    """Runs of one kind by task and settings; a seed's run once (a --samplers list that
    names the default sampler repeats the default's runs)."""
    by, seen = {}, set()
    for r in runs:
        if r["kind"] == kind:
            key = (r.get("task"),) + tuple(r.get(k) for k in SETTINGS)
            if key + (r.get("seed"),) in seen:
                continue
            seen.add(key + (r.get("seed"),))
            by.setdefault(key, []).append(r)
    return by


def pct(x):
    return f"{100 * x:.1f} %"


def summary(result, meta, default_sampler):
    """"What the figures say": the best configurations by each measure, and the issue's targets."""
    cond, ae, uncond, prompt = result["conditioned"], result["autoencoder"], result["unconditional"], result["prompt"]
    around = meta["around"]
    grid = [r for r in cond if r["resample"] == 0 and r["sampler"] == default_sampler]

    def name(r):
        return f"{r['method']}/{r['fill']}/from_t {r['from_t']:g}" + (f"/resample {r['resample']}" if r["resample"] else "") + (
            f"/{r['sampler']}" if r["sampler"] != default_sampler else "")

    def best(rows, field):
        top = max(r[field] for r in rows)
        winners = [r for r in rows if r[field] == top]
        return top, winners

    out = ["## What the figures say", ""]
    for task in TASKS:
        rows = [r for r in grid if r["task"] == task]
        parts = []
        for field, label in (("exact", "exact recovery"), ("whole_words", "whole words"),
                             ("dictionary_share", "dictionary"), ("consistency_sentences", "consistency (sentences)")):
            if field == "whole_words" and task != "word":
                continue
            top, winners = best(rows, field)
            low = min(r[field] for r in rows)
            names = ", ".join(name(r) for r in winners[:3]) + (f" and {len(winners) - 3} more" if len(winners) > 3 else "")
            parts.append(f"{label} {pct(low)}–{pct(top)} (best: {names})")
        out.append(f"- **{TASK_NAMES[task]}**, the {len(rows)} configurations of the grid: " + "; ".join(parts) + ".")
    pick = {t: next(r for r in cond if r["task"] == t and r["method"] == around["method"] and r["fill"] == around["fill"]
                    and r["from_t"] == around["from_t"] and r["resample"] == 0 and r["sampler"] == default_sampler)
            for t in TASKS}
    un = {t: next(r for r in uncond if r["task"] == t and r["sampler"] is None) for t in TASKS}
    au = {t: next(r for r in ae if r["task"] == t) for t in TASKS}
    p = pick["word"]
    out.append(f"- **{name(p)}** ({p['seeds']} seeds) on one word: exact {pct(p['exact'])}, whole words "
               f"{pct(p['whole_words'])}, dictionary {pct(p['dictionary_share'])}; the autoencoder alone "
               f"{pct(au['word']['exact'])} / {pct(au['word']['whole_words'])} / {pct(au['word']['dictionary_share'])}, "
               f"unconditional generation {pct(un['word']['exact'])} / {pct(un['word']['whole_words'])} / "
               f"{pct(un['word']['dictionary_share'])}. Of its fill tokens, " + ", ".join(
                   f"{pct(pick[t]['unchanged'])} ({TASK_NAMES[t]})" for t in TASKS) +
               " are what unconditional generation puts there from the same noise.")
    res = [r for r in cond if r["resample"] > 0]
    for r in res:
        if r["task"] == "word":
            out.append(f"- **Resampling** ({name(r)}, {r['calls']} calls instead of {p['calls']}): one word exact "
                       f"{pct(r['exact'])}, whole words {pct(r['whole_words'])}, dictionary {pct(r['dictionary_share'])}, "
                       f"consistency {pct(r['consistency_sentences'])} of sentences.")
    ft = {f: [r for r in grid if r["from_t"] == f] for f in (1.0, 0.8)}
    if ft[0.8]:
        out.append("- **from_t 0.8 against 1** (mean over the grid): " + "; ".join(
            f"{label} {pct(mean(r[k] for r in ft[0.8]))} against {pct(mean(r[k] for r in ft[1.0]))}"
            for k, label in (("exact", "exact"), ("dictionary_share", "dictionary"),
                             ("consistency_sentences", "consistency (sentences)"))) + ".")
    pc = {r["method"]: r for r in prompt}
    pu = pc[None]
    out.append(f"- **Prompt continuation:** dictionary {pct(pu['dictionary_share'])} unconditional, " + ", ".join(
        f"{pct(r['dictionary_share'])} with {m}" for m, r in pc.items() if m) +
        "; continuations that all differ across the seeds: " + ", ".join(
        f"{pct(r['changes_with_seed'])} ({m or 'unconditional'})" for m, r in pc.items()) +
        "; tokens of the continuation equal to unconditional generation's from the same noise: " + ", ".join(
        f"{pct(r['unchanged'])} ({m})" for m, r in pc.items() if m) + ".")
    tm = result["timing"]
    none = tm["step_seconds"]["none"]
    out.append("- **Cost:** whole steps with a condition against without: " + ", ".join(
        f"{k} {100 * (v / none - 1):+.1f} %" for k, v in tm["step_seconds"].items() if k != "none") +
        " (run-to-run noise of a shared machine); the hooks alone: " + ", ".join(
        f"{k} {100 * v / none:.3f} %" for k, v in tm.get("hook_seconds_per_step", {}).items()) + " of a step.")
    out.append("")
    return out


def render(raw_path, out):
    with open(raw_path) as f:
        data = json.load(f)
    meta, runs, sentences = data["meta"], data["runs"], data["sentences"]
    words = load_dictionary()
    if words is None:
        sys.exit("infill.py: /usr/share/dict/words is missing; install it with: apt-get install wamerican")
    originals = {t: [s["masks"][t]["text"] for s in sentences] for t in TASKS}
    prompts = [s["prompt"] for s in sentences]
    result = {"meta": meta, "originals": {t: {"dictionary_share": dictionary_share(originals[t], words),
                                              "whole_words": mean(is_whole_word(x, words) for x in originals[t])}
                                          for t in TASKS}}

    # What the same seed gives without a condition, to tell how much the condition moves the fills.
    default_sampler = meta["around"]["sampler"]
    free_run = {(r["kind"], r.get("task"), r.get("sampler") or default_sampler, r["seed"]): r["fill_ids"]
                for r in runs if r["kind"] in ("unconditional", "prompt") and r.get("method") is None}

    def unchanged(rs, base_kind):
        """The share of fill tokens equal to unconditional generation's from the same seed and sampler."""
        same = total = 0
        for r in rs:
            for a, b in zip(r["fill_ids"], free_run[(base_kind, r.get("task"), r["sampler"], r["seed"])]):
                same += sum(x == y for x, y in zip(a, b))
                total += len(a)
        return same / max(1, total)

    def table_rows(kind):
        rows = []
        for key, rs in group(runs, kind).items():
            row = dict(zip(["task"] + SETTINGS, key))
            row.update(score(rs, words))
            if kind in ("conditioned", "prompt") and row["method"] is not None:
                base_kind = "unconditional" if kind == "conditioned" else "prompt"
                row["unchanged"] = unchanged(rs, base_kind)
            rows.append(row)
        return rows

    ae, alone, uncond, cond = (table_rows(k) for k in ("autoencoder", "known_alone", "unconditional", "conditioned"))
    prompt = table_rows("prompt")
    result.update(autoencoder=ae, known_alone=alone, unconditional=uncond, conditioned=cond, prompt=prompt,
                  timing=data["timing"])

    # Prompt continuations: does the text change with the seed?
    by_seed = {}
    for r in runs:
        if r["kind"] == "prompt":
            by_seed.setdefault(r.get("method"), {})[r["seed"]] = r["fills"]
    for row in prompt:
        seeds = by_seed[row["method"]]
        per_sentence = list(zip(*[seeds[s] for s in sorted(seeds)]))
        row["changes_with_seed"] = mean(len(set(x)) == len(x) for x in per_sentence)

    cpu = f"{meta['cpu']} (AMD EPYC Zen 5, family {meta['cpu_family']}, model {meta['cpu_model']})"
    n = len(sentences)
    counts = ", ".join(f"{k} {v}" for k, v in sorted(meta["kept"].items()))
    lines = ["# Infill and prompt continuation with known tokens", "",
             f"{meta['model']}; {n} sentences ({counts}); seeds 0–{meta['seeds'] - 1} (the grid of methods × fills × "
             f"from_t: seed{'s 0–' + str(meta['grid_seeds'] - 1) if meta['grid_seeds'] > 1 else ' 0'}); {cpu}, "
             f"{meta['threads']} thread; the whole measurement took {meta['seconds'] / 60:.1f} min"
             + (f" ({meta['cpu_seconds'] / 60:.1f} min of CPU time on a shared machine" if "cpu_seconds" in meta else "")
             + (f", load average {meta['load_average_start']:.1f} at the start and {meta['load_average_end']:.1f} at "
                "the end" if "load_average_start" in meta else "")
             + (")" if "cpu_seconds" in meta else "") + ".", "",
             "Written by `research/infill.py` from `ldlm_infill_eval` (research/infill_eval.cpp); the method is "
             "docs/model.md §Conditioning. Commands:", "", "```sh",
             "PYTHONPATH=tools /usr/bin/python3 -m research.train.prepare_data   # the corpus, with its held-out split",
             "PYTHONPATH=tools python3 -m research.infill sentences --data build/train-data --out build/infill/sentences.tsv",
             "cmake --build build/default --target ldlm_infill_eval\n"
             "build/default/research/ldlm_infill_eval --sentences build/infill/sentences.tsv "
             f"--output build/infill/raw.json --seeds {meta['seeds']} --grid-seeds {meta['grid_seeds']} --around "
             f"{meta['around']['method']},{meta['around']['fill']},{meta['around']['from_t']:g} --threads 1",
             "PYTHONPATH=tools python3 -m research.infill render build/infill/raw.json --out research/results/infill-amd-epyc-zen5",
             "```", "",
             "- **Sentences:** the held-out documents' sentences (plain ASCII, 6–40 words), "
             f"{meta['per_source']} per source in hash order, 9–64 GPT-2 tokens, and "
             "research/train/modern_english.txt.",
             "- **Masks:** per sentence, one word after the first token (all of its tokens, its leading space "
             "included, letters only), a span of 3 and a span of 8 tokens on word boundaries; one task at a time.",
             "- **exact:** the fill's ids equal the original ids. **whole word:** the fill is a space and one word of "
             "/usr/share/dict/words (wamerican). **dictionary:** the model card's share of the fills' words found "
             "in it. **consistency:** the share of known tokens (and of sentences with every known token) that "
             "the decoded latents reproduce before the known ids are restored (the output always carries them). "
             "**unchanged:** the share of fill tokens equal to unconditional generation's at the same positions from "
             "the same seed and sampler (how little the condition moves them).",
             f"- Sampler {default_sampler} (10 steps, karras grid, endpoint x(t_min)) unless a row says otherwise; "
             "every figure is the mean over the seeds.", ""]
    orig = result["originals"]
    lines += ["The masked originals themselves: " + "; ".join(
        f"{TASK_NAMES[t]}: {pct(orig[t]['whole_words'])} whole words, {pct(orig[t]['dictionary_share'])} dictionary"
        for t in TASKS) + ".", ""]

    def find(rows, **kw):
        return [r for r in rows if all(r.get(k) == v for k, v in kw.items())]

    def cells(r, known=True):
        c = [pct(r["exact"]), pct(r["whole_words"]), pct(r["dictionary_share"])]
        if known:
            c += [pct(r["consistency_tokens"]) if "consistency_tokens" in r else "–",
                  pct(r["consistency_sentences"]) if "consistency_sentences" in r else "–"]
        return c

    lines += summary(result, meta, default_sampler)

    # Baselines and the best rows, per task.
    head = "| | " + " | ".join(f"{TASK_NAMES[t]}: exact / whole word / dictionary" for t in TASKS) + " |"
    lines += ["## Infill against the baselines", "", head, "|---|" + "---|" * len(TASKS)]

    def line(name, pick):
        out = []
        for t in TASKS:
            r = pick(t)
            out.append(" / ".join(cells(r, known=False)) if r else "")
        lines.append(f"| {name} | " + " | ".join(out) + " |")

    line("autoencoder alone on the masked ids", lambda t: find(ae, task=t)[0])
    line(f"unconditional generation ({default_sampler})",
         lambda t: find(uncond, task=t, sampler=None)[0] if find(uncond, task=t, sampler=None) else None)
    base = dict(from_t=1.0, resample=0, sampler=default_sampler)
    for m in ("x0", "x", "both"):
        for fill in ("mask", "pad", "separate"):
            line(f"conditioned: {m}, fill {fill}", lambda t: find(cond, task=t, method=m, fill=fill, **base)[0])
    lines.append("")

    # Every conditioned configuration.
    lines += ["## Every conditioned configuration", "",
              "| task | method | fill | from_t | resample | sampler | calls | seeds | exact | whole word | dictionary | "
              "consistency (tokens) | consistency (sentences) | unchanged | s per run |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(cond, key=lambda r: (TASKS.index(r["task"]), r["sampler"] != default_sampler, r["sampler"],
                                         r["resample"], -r["from_t"], r["method"], r["fill"])):
        lines.append(f"| {r['task']} | {r['method']} | {r['fill']} | {r['from_t']:g} | {r['resample']} | {r['sampler']} "
                     f"| {r['calls']} | {r['seeds']} | " + " | ".join(cells(r)) + f" | {pct(r['unchanged'])} | {r['seconds']:.1f} |")
    lines += ["", "Unconditional generation by sampler (the same positions):", "",
              "| task | sampler | exact | whole word | dictionary |", "|---|---|---|---|---|"]
    for r in sorted(uncond, key=lambda r: (TASKS.index(r["task"]), r["sampler"] or "")):
        lines.append(f"| {r['task']} | {r['sampler'] or default_sampler} | " + " | ".join(cells(r, known=False)) + " |")

    # Known latents.
    lines += ["", "## Known latents: what stands at the free positions while encoding", "",
              "Decoded by themselves (mask, pad: the whole filled sequence; separate: each run of known "
              "tokens alone), the share of known tokens reproduced, and of sentences with all of them; then "
              f"the consistency after sampling ({default_sampler}, from_t 1, mean over methods).", "",
              "| task | fill | alone: tokens | alone: sentences | sampled: tokens | sampled: sentences |",
              "|---|---|---|---|---|---|"]
    for r in sorted(alone, key=lambda r: (TASKS.index(r["task"]), r["fill"])):
        sampled = find(cond, task=r["task"], fill=r["fill"], **base)
        lines.append(f"| {r['task']} | {r['fill']} | {pct(r['consistency_tokens'])} | {pct(r['consistency_sentences'])} "
                     f"| {pct(mean(x['consistency_tokens'] for x in sampled))} "
                     f"| {pct(mean(x['consistency_sentences'] for x in sampled))} |")

    # Prompt continuation.
    lines += ["", f"## Prompt continuation: the first {meta['prompt_tokens']} tokens, T = {meta['prompt_length']}", "",
              f"The {meta['prompt_length'] - meta['prompt_tokens']} tokens after each sentence's first "
              f"{meta['prompt_tokens']} (fill {meta['around']['fill']}, from_t {meta['around']['from_t']:g}); "
              "unconditional generation at the same positions from the same seeds. **changes with the seed:** "
              "the share of prompts whose continuations all differ across the seeds.", "",
              "| | dictionary | consistency (tokens) | unchanged | changes with the seed |", "|---|---|---|---|---|"]
    for r in sorted(prompt, key=lambda r: (r["method"] is not None, r["method"] or "")):
        name = f"conditioned: {r['method']}" if r["method"] else "unconditional"
        cons = pct(r["consistency_tokens"]) if "consistency_tokens" in r else "–"
        unchanged = pct(r["unchanged"]) if "unchanged" in r else "–"
        lines.append(f"| {name} | {pct(r['dictionary_share'])} | {cons} | {unchanged} | {pct(r['changes_with_seed'])} |")

    # Cost.
    tm = data["timing"]
    none = tm["step_seconds"]["none"]
    lines += ["", "## Cost", "",
              f"Seconds per sampling step ({tm['sampler']}, {tm['steps']} steps), B = {tm['batch']}, T = "
              f"{tm['length']}, the first {tm['known_per_sequence']} tokens of each sequence known; median of "
              f"{tm['rounds']} rounds, the variants alternating within each round:", "",
              "| condition | ms per step | against none |", "|---|---|---|"]
    for name, s in sorted(tm["step_seconds"].items(), key=lambda kv: kv[0] != "none"):
        lines.append(f"| {name} | {1e3 * s:.2f} | {100 * (s / none - 1):+.1f} % |")
    hooks = tm.get("hook_seconds_per_step", {})
    if hooks:
        lines += ["", "The condition's hooks alone, per step (one x̂0 replacement and one x replacement, as a "
                  "single-call step runs them, on the same rows; median of the rounds): " + ", ".join(
                      f"{k} {1e6 * v:.1f} µs ({100 * v / none:.3f} % of a step)" for k, v in hooks.items()) + "."]
    lines += ["", "Encoding the known latents, once per generation: " + ", ".join(
        f"{k} {1e3 * v:.1f} ms" for k, v in tm["encode_seconds"].items()) +
        f" ({tm['encode_seconds']['mask'] / none:.1f} steps' time for mask)."]
    lines += ["", "Denoiser calls per run (10 steps): " + "; ".join(sorted({
        f"{r['sampler']} resample {r['resample']}: {r['calls']}" for r in cond})) + ".", ""]

    # Examples.
    lines += ["## Examples (seed 0)", ""]
    seed0 = {(r["kind"], r.get("task"), r.get("method"), r.get("fill"), r.get("from_t"), r.get("resample"),
              r.get("sampler")): r for r in runs if r.get("seed", 0) == 0}
    around = meta["around"]
    key = ("conditioned", "word", around["method"], around["fill"], around["from_t"], 0, default_sampler)
    ae_w = seed0[("autoencoder", "word", None, None, None, None, None)]
    un_w = seed0[("unconditional", "word", None, None, None, None, None)]
    lines += ["| sentence (masked word in [ ]) | autoencoder | unconditional | conditioned |", "|---|---|---|---|"]
    for i in range(0, n, max(1, n // 12)):
        m = sentences[i]["masks"]["word"]
        shown = f"{m['before']} [{m['text'].strip()}]{m['after']}"
        lines.append(f"| {shown} | `{ae_w['fills'][i]}` | `{un_w['fills'][i]}` | `{seed0[key]['fills'][i]}` |")
    pkey = ("prompt", None, around["method"], around["fill"], around["from_t"], 0, default_sampler)
    lines += ["", "Prompt continuations:", ""]
    for i in range(0, n, max(1, n // 6)):
        continuation = seed0[pkey]["fills"][i].replace("\n", "\\n")
        lines.append(f"- `{prompts[i]}` → `{continuation}`")
    lines.append("")

    with open(out + ".md", "w") as f:
        f.write("\n".join(lines))
    with open(out + ".json", "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {out}.md and .json")

# ---------------------------------------------------------------------- bigram baseline
def bigram_baseline(raw_path, data_dir, out):
    """Each masked word of the one-word task filled with the one token w that maximises
    C(left, w) · C(w, right) / C(w) over the training stream's bigram counts (left only
    at the sentence's end). Words of several tokens count as misses."""
    import numpy as np
    from .train.common import decode, encode  # the training stack: torch and the reference tokenizer

    with open(raw_path) as f:
        sentences = json.load(f)["sentences"]
    stream = np.fromfile(os.path.join(data_dir, "train.tokens.u16"), dtype=np.uint16).astype(np.int64)
    vocab = int(stream.max()) + 1
    unigram = np.bincount(stream, minlength=vocab)
    pairs, counts = np.unique(stream[:-1] * vocab + stream[1:], return_counts=True)
    followers, leaders = {}, {}
    for pair, count in zip(pairs.tolist(), counts.tolist()):
        left, right = divmod(pair, vocab)
        followers.setdefault(left, {})[right] = count
        leaders.setdefault(right, {})[left] = count

    words = load_dictionary()
    exact = single = 0
    fills = []
    for s, ids in zip(sentences, encode([s["text"] for s in sentences])):
        m = s["masks"]["word"]
        start, length = m["start"], m["length"]
        single += length == 1
        right = ids[start + length] if start + length < len(ids) else None
        candidates = followers.get(ids[start - 1], {})

        def score(w):
            if right is None:
                return candidates[w]
            return candidates[w] * leaders.get(right, {}).get(w, 0) / unigram[w]

        best = max(candidates, key=score) if candidates else None
        exact += best is not None and [best] == ids[start:start + length]
        fills.append([best] if best is not None else [])
    texts = decode(fills)
    n = len(sentences)
    whole = sum(is_whole_word(t, words) for t in texts) if words else float("nan")
    lines = [
        "# Infill reference point: a bigram model of the training stream",
        "",
        f"The one-word task of `{os.path.basename(raw_path)}`'s {n} sentences (research/infill.py; "
        f"{single} of the masked words are one GPT-2 token). Each masked word is filled with the one "
        "token w that maximises C(left, w) · C(w, right) / C(w), with the counts of the "
        f"{stream.size:,} tokens of research/train's training stream (the held-out sentences are not "
        "in it); a word of several tokens is a miss. Written by:",
        "",
        "```sh",
        f"PYTHONPATH=tools /usr/bin/python3 -m research.infill bigram {raw_path} --data {data_dir} --out {out}",
        "```",
        "",
        "| | exact | whole word |",
        "|---|---|---|",
        f"| bigram, both sides | {pct(exact / n)} | {pct(whole / n)} |",
        "",
        "The figure is what the corpus's word statistics alone allow; the diffusion model's "
        "conditioned fills are in infill-amd-epyc-zen5.md.",
        "",
    ]
    with open(out + ".md", "w") as f:
        f.write("\n".join(lines))
    print(f"wrote {out}.md: exact {pct(exact / n)}, whole word {pct(whole / n)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("sentences", help="write the candidate sentences")
    s.add_argument("--data", default=os.path.join(HERE, "..", "build", "train-data"))
    s.add_argument("--out", required=True)
    r = sub.add_parser("render", help="write the report from ldlm_infill_eval's JSON")
    r.add_argument("results")
    r.add_argument("--out", required=True, help="path without extension: writes .md and .json")
    b = sub.add_parser("bigram", help="the bigram reference point for the one-word task")
    b.add_argument("results", help="ldlm_infill_eval's JSON (its sentences and masks)")
    b.add_argument("--data", default=os.path.join(HERE, "..", "build", "train-data"))
    b.add_argument("--out", required=True, help="path without extension: writes .md")
    a = ap.parse_args()
    if a.command == "sentences":
        write_sentences(a.data, a.out)
    elif a.command == "bigram":
        bigram_baseline(a.results, a.data, a.out)
    else:
        render(a.results, a.out)


if __name__ == "__main__":
    sys.exit(main())
