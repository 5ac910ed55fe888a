#!/usr/bin/env python3
# Regenerates tests/data/llama3_pretokenize.json (run from the repository root; needs `pip install tokenizers`).
# Reference pre-token splits of Llama 3's Split regex, from Hugging Face `tokenizers` (onig), for the C++ scanner test.
import json, random
from tokenizers import pre_tokenizers, Regex
PAT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
split = pre_tokenizers.Split(Regex(PAT), behavior="isolated", invert=False)
fixed = [
  "Hello world", "I'M HERE, you're THERE; they'Ve we'LL i'd he'S it'T", "12345 1234567890 12 1",
  "  leading and trailing  ", "a\n\nb\r\n\r\nc \n d\t\te", "!!!hello ...world?!", "'quoted' and 'hello",
  "café ναι 你好 ١٢٣٤ ½ ² Ⅻ", "x\u3000y\u00a0z\u2028w", "tab\tsep\there", "  \n  \n  x", "\n", " ", "  ",
  "e=mc^2; f(x)={x|x>0}", "snake_case and kebab-case and CamelCase", "emoji 🙂🙂 ok👍🏽!", "$1,000.00 - 50%",
  "line\r\rbreaks\n\r", "a'b'c'", "'", "''s", "don't'", "x  !!  y", "\t!", " !x", "\u00a0hello", "1a2b33ccc4444",
]
pool = list("aAzZ'sStT rReEvVmMlLdD0123456789 \t\r\n!?.,;:-_()[]{}\"/\\@#$%^&*+=<>|~`") + \
       ["é", "ß", "ж", "你", "١", "²", "½", "\u3000", "\u00a0", "\u2028", "🙂", "\u0301", "ſ", "\u200b", "\x0b", "\x0c", "\x85"]
rng = random.Random(2026)
cases = fixed + ["".join(rng.choice(pool) for _ in range(rng.randint(1, 40))) for _ in range(600)]
out = []
for t in cases:
    pieces = split.pre_tokenize_str(t)
    assert "".join(p for p, _ in pieces) == t
    out.append({"text": t, "pieces": [p for p, _ in pieces]})
json.dump({"regex": PAT, "source": "Hugging Face tokenizers " + __import__("tokenizers").__version__ +
           ", pre_tokenizers.Split(Regex(regex), behavior='isolated')", "cases": out},
          open("tests/data/llama3_pretokenize.json", "w"), ensure_ascii=False, indent=0)
print(len(out))
