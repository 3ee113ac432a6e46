#!/usr/bin/python3
"""Build the demo model's corpus from Debian packages and tokenize it with GPT-2's BPE.

    PYTHONPATH=tools /usr/bin/python3 -m research.train.prepare_data [--out build/train-data]

Needs the Debian packages below (installed by name with apt-get) and
`npm ci` run once in research/train (tiktoken for the tokenizer).

Sources, one document per unit; a unit is held out whole (never single tokens):
  fortunes, fortunes-min   one fortune cookie            /usr/share/games/fortunes
  bible-kjv-text (+ the `bible` reader of bible-kjv)     one verse
  python3-doc (python3.11-doc)  one prose paragraph of the reST sources
  wordnet-base             one synset: "lemma: gloss. Example sentences."

Writes into --out (default build/train-data, which git ignores):
  docs.jsonl                 {"source", "key", "split", "text"} per document
  {train,heldout}.tokens.u16 every document's ids followed by the ids of "\n\n", concatenated
  {train,heldout}.docs.u32   start offset of every document in the token stream
  {train,heldout}.source.u8  source index (SOURCES order) of every document
  meta.json                  counts per source and split, sha256 of every file
Deterministic: fixed file order, the split is a hash of (source, key).
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import subprocess
import sys

import numpy as np

from .common import DATA_DIR, SOURCES

HERE = os.path.dirname(os.path.abspath(__file__))
HELDOUT_PER_MILLE = 20  # 2% of the documents of every source

FORTUNE_DIR = "/usr/share/games/fortunes"
# ascii-art is pictures; ethnic and men-women are stereotype jokes a demo should not echo.
FORTUNE_SKIP = {"ascii-art", "ethnic", "men-women"}
PYDOC_DIR = "/usr/share/doc/python3.11-doc/html/_sources"
WORDNET_DIR = "/usr/share/wordnet"


def fnv1a64(text: str) -> int:
    h = 0xCBF29CE484222325
    for b in text.encode("utf-8"):
        h = ((h ^ b) * 0x100000001B3) & ((1 << 64) - 1)
    return h


def split_of(source: str, key: str) -> str:
    return "heldout" if fnv1a64(source + "\0" + key) % 1000 < HELDOUT_PER_MILLE else "train"


def require(path: str, package: str) -> None:
    if not os.path.exists(path):
        sys.exit(f"prepare_data: {path} is missing; install it with: apt-get install {package}")


# ------------------------------------------------------------------------- sources
def fortunes():
    require(FORTUNE_DIR, "fortunes fortunes-min")
    names = sorted(n for n in os.listdir(FORTUNE_DIR) if "." not in n and n not in FORTUNE_SKIP)
    for name in names:
        with open(os.path.join(FORTUNE_DIR, name), encoding="utf-8", errors="replace") as f:
            cookies = re.split(r"^%\n", f.read(), flags=re.M)
        for i, c in enumerate(cookies):
            text = "\n".join(line.rstrip() for line in c.expandtabs(8).strip("\n").split("\n")).strip()
            if len(text.split()) >= 3:
                yield f"{name}/{i}", text


def bible():
    require("/usr/lib/bible.data", "bible-kjv-text bible-kjv")
    out = subprocess.run(["bible", "-l100000", "gen1:1-rev22:21"], check=True, capture_output=True, text=True).stdout
    chapter, verse, text = None, None, []
    for line in out.split("\n"):
        m = re.match(r"^(\S.*) (\d+)$", line)
        v = re.match(r"^\s+(\d+) (.*)$", line)
        if m or v or not line.strip():
            if verse is not None and text:
                yield f"{chapter}:{verse}", " ".join(text)
            verse, text = None, []
        if m:
            chapter = f"{m.group(1)} {m.group(2)}"
        elif v:
            verse, text = v.group(1), [v.group(2).strip()]
        elif line.strip():
            text.append(line.strip())
    if verse is not None and text:
        yield f"{chapter}:{verse}", " ".join(text)


_ROLE = re.compile(r":[a-z:]+:`!?~?([^`<]*?)(?:\s*<[^>]*>)?`")
_LINK = re.compile(r"`([^`<]+?)\s*<[^>]*>`_+")
_LITERAL = re.compile(r"``([^`]+)``")
_EMPH = re.compile(r"(?<![\w*])\*{1,2}([^*\n]+?)\*{1,2}(?![\w*])")
_REF = re.compile(r"`([^`]+)`_+")


def rest_to_prose(block: str) -> str:
    s = " ".join(line.strip() for line in block.split("\n"))
    s = _ROLE.sub(lambda m: m.group(1).strip(), s)
    s = _LINK.sub(r"\1", s)
    s = _LITERAL.sub(r"\1", s)
    s = _REF.sub(r"\1", s)
    s = _EMPH.sub(r"\1", s)
    s = re.sub(r"::$", ":", s)
    s = re.sub(r"\s+", " ", s).strip()
    return s


def is_prose(s: str) -> bool:
    words = s.split()
    if len(words) < 6:
        return False
    letters = sum(ch.isalpha() or ch == " " for ch in s)
    return letters / len(s) > 0.85 and re.search(r"[a-z]{3,}", s) is not None


def python_doc():
    require(PYDOC_DIR, "python3-doc")
    files = sorted(glob.glob(os.path.join(PYDOC_DIR, "**", "*.rst.txt"), recursive=True))
    for path in files:
        rel = os.path.relpath(path, PYDOC_DIR)
        if rel.startswith("whatsnew/changelog"):
            continue  # thousands of one-line issue titles, not prose
        with open(path, encoding="utf-8", errors="replace") as f:
            blocks = re.split(r"\n\s*\n", f.read())
        for i, block in enumerate(blocks):
            first = block.lstrip("\n").split("\n")[0]
            if not first or first[0].isspace() or first.startswith((".. ", ">>>", "|", "+", "*", "-", "#", "=")):
                continue
            if any(re.fullmatch(r"[=\-~^\"'`#*+:.]{3,}", line.strip()) for line in block.split("\n")):
                continue  # a heading
            s = rest_to_prose(block)
            if is_prose(s):
                yield f"{rel}/{i}", s


def _sentence(s: str) -> str:
    s = s.strip().strip('"').strip()
    if not s:
        return s
    s = s[0].upper() + s[1:]
    return s if s[-1] in ".!?" else s + "."


def wordnet():
    require(os.path.join(WORDNET_DIR, "data.noun"), "wordnet-base")
    for pos in ("noun", "verb", "adj", "adv"):
        with open(os.path.join(WORDNET_DIR, f"data.{pos}"), encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("  ") or " | " not in line:
                    continue  # licence header
                fields, gloss = line.split(" | ", 1)
                parts = fields.split()
                n_words = int(parts[3], 16)
                lemmas = [re.sub(r"\(.*\)$", "", w).replace("_", " ") for w in parts[4:4 + 2 * n_words:2]]
                pieces = [p.strip() for p in gloss.strip().split(";") if p.strip()]
                definition = "; ".join(p for p in pieces if not p.startswith('"'))
                examples = [_sentence(p) for p in pieces if p.startswith('"')]
                text = f"{', '.join(lemmas)}: {definition.rstrip('.')}." + "".join(" " + e for e in examples)
                yield f"{pos}/{parts[0]}", text


READERS = {"fortunes": fortunes, "bible": bible, "python_doc": python_doc, "wordnet": wordnet}


# ------------------------------------------------------------------------ tokenizer
def tokenize(texts: list[str]) -> list[list[int]]:
    """GPT-2 ids of every text via tiktoken (research/train/tiktoken_gpt2.mjs)."""
    if not os.path.isdir(os.path.join(HERE, "node_modules", "tiktoken")):
        sys.exit(f"prepare_data: tiktoken is not installed; run `npm ci` in {HERE}")
    payload = "".join(json.dumps(t) + "\n" for t in texts).encode("utf-8")
    out = subprocess.run(["node", os.path.join(HERE, "tiktoken_gpt2.mjs"), "encode"], input=payload,
                         capture_output=True, check=True, cwd=HERE).stdout
    ids = [json.loads(line) for line in out.decode("utf-8").splitlines()]
    if len(ids) != len(texts):
        raise RuntimeError(f"tokenizer returned {len(ids)} lines for {len(texts)} texts")
    return ids


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DATA_DIR, help="output directory (default: build/train-data of the repository)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)

    docs = []
    for si, source in enumerate(SOURCES):
        n0 = len(docs)
        for key, text in READERS[source]():
            docs.append({"source": source, "key": key, "split": split_of(source, key), "text": text})
        print(f"{source:10s} {len(docs) - n0:8d} documents", flush=True)
    with open(os.path.join(a.out, "docs.jsonl"), "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")

    ids = tokenize([d["text"] + "\n\n" for d in docs])
    meta = {"sources": list(SOURCES), "heldout_per_mille": HELDOUT_PER_MILLE, "splits": {}, "files": {}}
    for split in ("train", "heldout"):
        sel = [i for i, d in enumerate(docs) if d["split"] == split]
        lengths = np.array([len(ids[i]) for i in sel], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.uint32)
        tokens = np.fromiter((t for i in sel for t in ids[i]), dtype=np.int64, count=int(lengths.sum()))
        assert tokens.min() >= 0 and tokens.max() < 50257, "tiktoken ids must be ordinary GPT-2 ids"
        src = np.array([SOURCES.index(docs[i]["source"]) for i in sel], dtype=np.uint8)
        tokens.astype(np.uint16).tofile(os.path.join(a.out, f"{split}.tokens.u16"))
        starts.tofile(os.path.join(a.out, f"{split}.docs.u32"))
        src.tofile(os.path.join(a.out, f"{split}.source.u8"))
        per_source = {}
        for s_i, s in enumerate(SOURCES):
            m = src == s_i
            per_source[s] = {"documents": int(m.sum()), "tokens": int(lengths[m].sum())}
        meta["splits"][split] = {"documents": len(sel), "tokens": int(tokens.size), "distinct_ids": int(np.unique(tokens).size),
                                 "per_source": per_source}
        print(f"{split:8s} {len(sel):8d} documents {tokens.size:10d} tokens "
              f"{meta['splits'][split]['distinct_ids']:6d} distinct ids", flush=True)
    for name in sorted(os.listdir(a.out)):
        if name != "meta.json":
            meta["files"][name] = sha256(os.path.join(a.out, name))
    with open(os.path.join(a.out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
        f.write("\n")
    print(json.dumps(meta["splits"], indent=1))


if __name__ == "__main__":
    main()
