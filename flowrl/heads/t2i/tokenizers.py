"""A real CLIP BPE tokenizer built from the vocabulary file open-clip-torch ships.

No tokenizer can be downloaded here, yet tests and the embedded demo need real ones.
open-clip-torch ships OpenAI's BPE merges (``bpe_simple_vocab_16e6.txt.gz``); the
transformers ``CLIPTokenizer`` files are written from open_clip's own tokenizer tables.
``num_merges`` keeps only the first merges (a smaller, still real BPE vocabulary for tiny
models).
"""
from __future__ import annotations

import json
import os
from typing import Dict, List, Optional, Tuple

SPECIALS = {"<start_of_text>": "<|startoftext|>", "<end_of_text>": "<|endoftext|>"}


def open_clip_bpe(num_merges: Optional[int] = None) -> Tuple[Dict[str, int], List[str]]:
    """(vocab token -> id, merges) of open-clip-torch's CLIP BPE, transformers' spelling.

    The vocabulary is ordered as OpenAI's: 256 byte symbols, the same with ``</w>``, one
    token per merge (in rank order), then the two special tokens; ``num_merges`` keeps
    the first merges only and renumbers the special tokens after them.
    """
    from open_clip.tokenizer import SimpleTokenizer

    t = SimpleTokenizer()
    merges = [" ".join(pair) for pair, _ in sorted(t.bpe_ranks.items(), key=lambda kv: kv[1])]
    if num_merges is not None:
        merges = merges[:num_merges]
    regular = [tok for tok, _ in sorted(t.encoder.items(), key=lambda kv: kv[1]) if tok not in SPECIALS]
    regular = regular[: 512 + len(merges)]
    vocab = {tok: i for i, tok in enumerate(regular)}
    for k, special in enumerate(SPECIALS.values()):
        vocab[special] = len(regular) + k
    return vocab, merges


def build_clip_tokenizer(directory: str, num_merges: Optional[int] = None, pad_token: str = "<|endoftext|>",
                         model_max_length: int = 77):
    """Write vocab.json + merges.txt for ``CLIPTokenizer`` into ``directory`` and load it.

    Returns the loaded ``transformers.CLIPTokenizer`` (its ``save_pretrained`` output is
    what pipelines load from their ``tokenizer`` folders).
    """
    from transformers import CLIPTokenizer

    vocab, merges = open_clip_bpe(num_merges)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "vocab.json"), "w", encoding="utf-8") as fh:
        json.dump(vocab, fh, ensure_ascii=False)
    with open(os.path.join(directory, "merges.txt"), "w", encoding="utf-8") as fh:
        fh.write("#version: 0.2\n" + "\n".join(merges) + "\n")
    tok = CLIPTokenizer(os.path.join(directory, "vocab.json"), os.path.join(directory, "merges.txt"),
                        pad_token=pad_token, model_max_length=model_max_length)
    tok.save_pretrained(directory)
    return tok
