"""The model card's dictionary-word share: the share of a text's words found in
/usr/share/dict/words (Debian's wamerican). research/train/evaluate.py,
research/samplers.py and research/infill.py report it."""
from __future__ import annotations

import os
import re

DICT_PATH = "/usr/share/dict/words"


WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?")


def in_dictionary(word: str, words: set[str]) -> bool:
    lw = word.lower()
    return lw in words or (lw.endswith("'s") and lw[:-2] in words)


def dictionary_share(texts: list[str], words: set[str]) -> float:
    found = total = 0
    for text in texts:
        for w in WORD.findall(text):
            total += 1
            found += in_dictionary(w, words)
    return found / max(1, total)


def is_whole_word(fill: str, words: set[str]) -> bool:
    """Whether `fill` is a space and one dictionary word, as a masked GPT-2 word is (research/infill.py)."""
    m = re.fullmatch(" (" + WORD.pattern + ")", fill)
    return m is not None and in_dictionary(m.group(1), words)


def load_dictionary() -> set[str] | None:
    """The dictionary's words, lower-cased; None when wamerican is not installed."""
    if not os.path.exists(DICT_PATH):
        return None
    with open(DICT_PATH, encoding="utf-8", errors="replace") as f:
        return {line.strip().lower() for line in f if line.strip()}
