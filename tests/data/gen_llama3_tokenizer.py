#!/usr/bin/env python3
# Regenerates tests/data/llama3_style_tokenizer.json and llama3_style_encodings.json (run from the repository root;
# needs `pip install tokenizers` and Debian's fortunes): a byte-level BPE in Llama 3's form (Split by Llama 3's regex,
# ByteLevel without its own regex, ignore_merges) trained by Hugging Face tokenizers on the fortunes, and its own
# encodings of texts that exercise the split, the merges and ignore_merges.
import glob, json, random
from tokenizers import Tokenizer, Regex, models, pre_tokenizers, decoders, trainers

PAT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
text = "".join(open(f, encoding="utf-8", errors="replace").read()
               for f in sorted(glob.glob("/usr/share/games/fortunes/*")) if "." not in f.split("/")[-1])
tok = Tokenizer(models.BPE(ignore_merges=True))
tok.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Split(Regex(PAT), behavior="isolated", invert=False),
    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
tok.train_from_iterator([text[i:i + 4096] for i in range(0, len(text), 4096)], trainer)
tok.save("tests/data/llama3_style_tokenizer.json")
rng = random.Random(3)
lines = [l for l in text.split("\n") if l.strip()]
texts = ["Hello world, I'M here; they'RE 1234567 apples!!\n\n  ok", "naïve café 你好 ١٢٣ x\u3000y", "  \t\r\n"]
texts += ["\n".join(rng.sample(lines, rng.randint(1, 4))) for _ in range(150)]
texts += ["".join(rng.choice("aZ'sT 09!?\n\t.é你") for _ in range(rng.randint(1, 30))) for _ in range(100)]
json.dump({"cases": [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids} for t in texts]},
          open("tests/data/llama3_style_encodings.json", "w"), ensure_ascii=False, indent=0)
print(tok.get_vocab_size(), len(texts))
