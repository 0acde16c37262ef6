"""A real CLIP BPE tokenizer built from the vocabulary file open-clip-torch ships.

No tokenizer can be downloaded here, yet tests and the embedded demo need real ones.
open-clip-torch ships OpenAI's BPE merges (``bpe_simple_vocab_16e6.txt.gz``); the
transformers ``CLIPTokenizer`` vocabulary is derived from them: the 256 byte symbols,
the same with the end-of-word marker ``</w>``, one token per merge, then the two special
tokens. ``num_merges`` keeps only the first merges (a smaller, still real BPE vocabulary
for tiny models).
"""
from __future__ import annotations

import gzip
import json
import os
from typing import Dict, List, Optional

FULL_MERGES = 49152 - 256 - 2


def _bytes_to_unicode() -> Dict[int, str]:
    """GPT-2's reversible byte -> printable unicode map used by CLIP's BPE."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def open_clip_merges(num_merges: Optional[int] = None) -> List[str]:
    """The BPE merges shipped with open-clip-torch (first ``num_merges`` of them)."""
    import open_clip

    path = os.path.join(os.path.dirname(open_clip.__file__), "bpe_simple_vocab_16e6.txt.gz")
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        lines = fh.read().split("\n")
    merges = lines[1 : FULL_MERGES + 1]
    return merges[: num_merges] if num_merges is not None else merges


def build_clip_tokenizer(directory: str, num_merges: Optional[int] = None, pad_token: str = "<|endoftext|>",
                         model_max_length: int = 77):
    """Write vocab.json + merges.txt for ``CLIPTokenizer`` into ``directory`` and load it.

    Returns the loaded ``transformers.CLIPTokenizer`` (its ``save_pretrained`` output is
    what pipelines load from their ``tokenizer`` folders).
    """
    from transformers import CLIPTokenizer

    merges = open_clip_merges(num_merges)
    symbols = list(_bytes_to_unicode().values())
    vocab = symbols + [s + "</w>" for s in symbols] + ["".join(m.split()) for m in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "vocab.json"), "w", encoding="utf-8") as fh:
        json.dump({tok: i for i, tok in enumerate(vocab)}, fh, ensure_ascii=False)
    with open(os.path.join(directory, "merges.txt"), "w", encoding="utf-8") as fh:
        fh.write("#version: 0.2\n" + "\n".join(merges) + "\n")
    tok = CLIPTokenizer(os.path.join(directory, "vocab.json"), os.path.join(directory, "merges.txt"),
                        pad_token=pad_token, model_max_length=model_max_length)
    tok.save_pretrained(directory)
    return tok
