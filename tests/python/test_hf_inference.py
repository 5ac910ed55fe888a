#!/usr/bin/env python3
"""The inference policies and ragged forward against transformers: tiny random Qwen2 (q/k/v biases), Llama (GQA,
llama3 rope scaling) and GPT-2 models saved by transformers itself, loaded by tests/inference_logits_dump through our
policies, the last token's logits compared with transformers' in float64. Tolerance: 1e-5 of the logits' scale (f32).
Skipped (exit 77, CTest's SKIP_RETURN_CODE) where torch or transformers is not installed.

Usage: python3 tests/python/test_hf_inference.py --dump build/tests/inference_logits_dump
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

try:
    import torch
    import transformers
except ImportError as e:
    print(f"SKIP: needs torch and transformers ({e})")
    sys.exit(77)

COMMON = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
              num_hidden_layers=2, vocab_size=97, max_position_embeddings=64, rms_norm_eps=1e-6)
CONFIGS = {
    "qwen2": lambda: transformers.Qwen2Config(**COMMON, rope_theta=1e6, tie_word_embeddings=True),
    "llama3": lambda: transformers.LlamaConfig(**COMMON, rope_theta=5e5, tie_word_embeddings=False, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16}),
    "gpt2": lambda: transformers.GPT2Config(n_embd=32, n_head=4, n_layer=2, vocab_size=97, n_positions=64),
}


def check(name, dump, tmp):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(CONFIGS[name]())
    with torch.no_grad():  # random biases and norms too: the default init leaves them 0 and 1
        for n, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.dim() == 1 else 0.1) + (1.0 if "norm" in n or "ln_" in n else 0.0))
    folder = os.path.join(tmp, name)
    model.save_pretrained(folder, safe_serialization=True)
    tokens = [(7 * i + 3) % 97 for i in range(11)]
    ours = json.loads(subprocess.run([dump, folder] + [str(t) for t in tokens], check=True, capture_output=True,
                                     text=True).stdout)
    model = model.double().eval()
    with torch.no_grad():
        want = model(input_ids=torch.tensor([tokens])).logits[0, -1]
    got = torch.tensor(ours, dtype=torch.float64)
    scale = want.abs().max().item()
    err = (got - want).abs().max().item()
    ok = err <= 1e-5 * scale
    print(f"{'PASS' if ok else 'FAIL'} {name}: worst |diff| {err:.3g}, logits scale {scale:.3g}")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dump", required=True, help="the inference_logits_dump executable")
    a = ap.parse_args()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        ok = all([check(n, a.dump, tmp) for n in CONFIGS])
    print("all passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
