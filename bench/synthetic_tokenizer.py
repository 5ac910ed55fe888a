#!/usr/bin/env python3
"""A byte-level BPE tokenizer.json of any vocabulary size, for serving benchmarks on dummy weights
(`dscpp serve --hf DIR --load-format dummy` needs a tokenizer of the model's vocabulary, and the GPU image has no
Hugging Face downloads). Its merges are arbitrary (pairs of common English letters first, then pairs of earlier
tokens), so text round-trips exactly but tokenizes unlike any real model's; the benchmark's token counts come from
the server's usage. Standard library only.

    python3 bench/synthetic_tokenizer.py --vocab 128256 --out DIR   # writes DIR/tokenizer.json (Llama 3's specials)
"""
import argparse
import json
import os
import random


def bytes_to_unicode():
    """GPT-2's map of the 256 byte values to printable characters (what ByteLevel pre-tokenizers store)."""
    bs = list(range(ord('!'), ord('~') + 1)) + list(range(ord('¡'), ord('¬') + 1)) + list(range(ord('®'), ord('ÿ') + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def build(vocab_size, specials, seed):
    byte_chars = bytes_to_unicode()
    vocab = {byte_chars[b]: b for b in range(256)}
    tokens = [byte_chars[b] for b in range(256)]
    merges = []
    n_merged = vocab_size - 256 - len(specials)
    if n_merged < 0:
        raise SystemExit(f'--vocab {vocab_size} is smaller than 256 bytes + {len(specials)} special tokens')
    rng = random.Random(seed)
    letters = [byte_chars[ord(c)] for c in 'etaoinshrdlucmfwypvbgk ']
    while len(merges) < n_merged:
        # Early merges join letters (real-looking words merge), later ones join tokens made so far.
        pool = letters if len(merges) < 200 else tokens
        a, b = rng.choice(pool), rng.choice(pool)
        if a + b in vocab or len(a + b) > 16:
            continue
        vocab[a + b] = len(tokens)
        tokens.append(a + b)
        merges.append(f'{a} {b}')
    added = []
    for i, s in enumerate(specials):
        vocab[s] = len(tokens)
        tokens.append(s)
        added.append({'id': vocab[s], 'content': s, 'single_word': False, 'lstrip': False, 'rstrip': False,
                      'normalized': False, 'special': True})
    return {
        'version': '1.0',
        'added_tokens': added,
        'normalizer': None,
        'pre_tokenizer': {'type': 'ByteLevel', 'add_prefix_space': False, 'trim_offsets': True, 'use_regex': True},
        'post_processor': None,
        'decoder': {'type': 'ByteLevel', 'add_prefix_space': True, 'trim_offsets': True, 'use_regex': True},
        'model': {'type': 'BPE', 'dropout': None, 'unk_token': None, 'continuing_subword_prefix': None,
                  'end_of_word_suffix': None, 'fuse_unk': False, 'byte_fallback': False, 'vocab': vocab,
                  'merges': merges},
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--vocab', type=int, required=True, help='vocabulary size, special tokens included')
    ap.add_argument('--out', required=True, help='folder to write tokenizer.json into')
    ap.add_argument('--specials', default='<|begin_of_text|>,<|end_of_text|>,<|eot_id|>',
                    help='comma-separated special tokens, last ids (default: Llama 3\'s three)')
    ap.add_argument('--seed', type=int, default=0)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    tok = build(a.vocab, [s for s in a.specials.split(',') if s], a.seed)
    path = os.path.join(a.out, 'tokenizer.json')
    with open(path + '.tmp', 'w', encoding='utf-8') as f:
        json.dump(tok, f, ensure_ascii=False)
    os.replace(path + '.tmp', path)
    print(f'{path}: {len(tok["model"]["vocab"])} tokens, {len(tok["model"]["merges"])} merges')


if __name__ == '__main__':
    main()
