"""The model card's dictionary-word share: the share of a text's words found in
/usr/share/dict/words (Debian's wamerican). tools/train/evaluate.py and
bench/samplers.py both report it."""
from __future__ import annotations

import os
import re

DICT_PATH = "/usr/share/dict/words"


def dictionary_share(texts: list[str], words: set[str]) -> float:
    found = total = 0
    for text in texts:
        for w in re.findall(r"[A-Za-z]+(?:'[A-Za-z]+)?", text):
            total += 1
            lw = w.lower()
            found += lw in words or (lw.endswith("'s") and lw[:-2] in words)
    return found / max(1, total)


def load_dictionary() -> set[str] | None:
    """The dictionary's words, lower-cased; None when wamerican is not installed."""
    if not os.path.exists(DICT_PATH):
        return None
    with open(DICT_PATH, encoding="utf-8", errors="replace") as f:
        return {line.strip().lower() for line in f if line.strip()}
