#!/usr/bin/env python3
"""Hugging Face interop against real `transformers` (optional: needs torch + transformers; run where they exist).

Both directions, GPT-2 and Llama (tied and untied; from transformers also Llama 3.1's rope_scaling):
  1. transformers -> dscpp: a random transformers model saved with save_pretrained (safetensors) is loaded by
     `dscpp ckpt hf-logits`; its logits must equal transformers' on the same tokens.
  2. dscpp -> transformers: `dscpp train` for one step (presets, and a Llama 3 rope-scaling config), `dscpp ckpt
     export` (f32 and bf16); transformers loads the
     folder with no missing or unexpected weights and gives the logits of our model (`dscpp ckpt hf-logits` on the
     same folder; the C++ tests prove that import(export(model)) is bit-exact).

Usage: python tests/python/test_hf_transformers.py [--dscpp build/dscpp]   (default: $DSCPP, else build/dscpp
       in the repository)
Prints one line per case and exits 1 on any failure.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
import transformers

TOKENS = [1, 7, 42, 3, 99, 0, 5, 64, 17, 2]
TOL = {"f32": 2e-4, "bf16": 2e-4}  # same weights on both sides, f32 math: only summation order differs
# from_pretrained's dtype argument: `dtype` since transformers 4.56 (`torch_dtype` is deprecated there), before it
# `torch_dtype`.
_TF_VERSION = tuple(int(x) for x in transformers.__version__.split(".")[:2] if x.isdigit())
DTYPE_F32 = {"dtype": torch.float32} if _TF_VERSION >= (4, 56) else {"torch_dtype": torch.float32}
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def dscpp_logits(dscpp, folder, vocab):
    out = os.path.join(folder, "dscpp_logits.json")
    subprocess.run([dscpp, "ckpt", "hf-logits", folder, "--tokens", ",".join(map(str, TOKENS)), "-o", out],
                   check=True)
    with open(out) as f:
        j = json.load(f)
    assert j["shape"] == [len(TOKENS), vocab], j["shape"]
    return torch.tensor(j["logits"], dtype=torch.float64).view(len(TOKENS), vocab)


def hf_logits(model):
    with torch.no_grad():
        return model(torch.tensor([TOKENS])).logits[0].double()


def report(name, got, want, tol):
    err = ((got - want).abs() / (1 + want.abs())).max().item()
    ok = err <= tol
    print(f"{'PASS' if ok else 'FAIL'} {name}: worst relative error {err:.3g} (threshold {tol:g})")
    return ok


def random_hf_model(kind):
    torch.manual_seed(0)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=32)
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        # llama3-rope: Llama 3.1's frequency scaling, with an original context of 16 so that the ten positions below
        # meet all three bands (head dim 16: wavelengths 6.3, 20, 63, ... against 16 / 4 and 16 / 1).
        scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 16} if kind == "llama3-rope" else None
        # theta 1000, not the default 10000: a reader that misses where the config keeps it (transformers 5 moved it
        # into rope_parameters) must fail here.
        if scaling:
            scaling["rope_theta"] = 1000.0
        cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                       max_position_embeddings=32, tie_word_embeddings=(kind == "llama-tied"),
                                       rope_theta=1000.0, rope_scaling=scaling)
        model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():  # every tensor random (biases and norm gains too), so any mix-up shows
        for name, p in model.named_parameters():
            gain = name.endswith("weight") and ("ln_" in name or "norm" in name)
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if gain else 0.0))
    return model.float().eval()


def hf_to_dscpp(dscpp, tmp, kind):
    model = random_hf_model(kind)
    folder = os.path.join(tmp, "from_hf_" + kind)
    model.save_pretrained(folder, safe_serialization=True)
    return report(f"transformers -> dscpp ({kind})", dscpp_logits(dscpp, folder, model.config.vocab_size),
                  hf_logits(model), TOL["f32"])


def llama3_rope_config(tmp):
    """A tiny Llama with Llama 3.1's rope scaling, as a config.json `dscpp train --model` reads."""
    path = os.path.join(tmp, "llama3_rope_config.json")
    with open(path, "w") as f:
        json.dump({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2,
                   "hidden_size": 64, "intermediate_size": 160, "num_attention_heads": 4, "num_key_value_heads": 2,
                   "vocab_size": 2048, "max_position_embeddings": 32, "rms_norm_eps": 1e-5, "rope_theta": 1000.0,
                   "tie_word_embeddings": True,
                   "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}, f)
    return path


def dscpp_to_hf(dscpp, tmp, preset, dtype):
    model_arg = llama3_rope_config(tmp) if preset == "llama3-rope" else preset
    run = os.path.join(tmp, "run_" + preset)
    if not os.path.isdir(os.path.join(run, "checkpoints")):
        subprocess.run([dscpp, "train", "--model", model_arg, "--steps", "1", "--seq-len", "32", "--samples", "0",
                        "--out", run], check=True, stdout=subprocess.DEVNULL)
    folder = os.path.join(tmp, f"export_{preset}_{dtype}")
    subprocess.run([dscpp, "ckpt", "export", os.path.join(run, "checkpoints"), "--format", "safetensors", "-o",
                    folder, "--dtype", dtype], check=True, stdout=subprocess.DEVNULL)
    model, info = transformers.AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True,
                                                                    **DTYPE_F32)
    buffers = (".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq")
    # Lists in transformers 4, sets in 5.
    bad = [k for k in list(info["missing_keys"]) + list(info["unexpected_keys"]) if not k.endswith(buffers)]
    if bad:
        print(f"FAIL dscpp -> transformers ({preset}, {dtype}): missing/unexpected weights {bad}")
        return False
    model.eval()
    return report(f"dscpp -> transformers ({preset}, {dtype})",
                  hf_logits(model), dscpp_logits(dscpp, folder, model.config.vocab_size), TOL[dtype])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dscpp", default=os.environ.get("DSCPP", os.path.join(ROOT, "build", "dscpp")),
                    help="path to the dscpp executable (default: $DSCPP, else build/dscpp in the repository)")
    ap.add_argument("--keep", help="work in this folder and keep it (default: a temp folder, removed)")
    a = ap.parse_args()
    if not os.access(a.dscpp, os.X_OK):
        print(f"FAIL: no dscpp executable at {a.dscpp} (build the dscpp target, or pass --dscpp PATH)")
        return 1
    a.dscpp = os.path.abspath(a.dscpp)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    with tempfile.TemporaryDirectory() as t:
        tmp = a.keep or t
        os.makedirs(tmp, exist_ok=True)
        ok = True
        for kind in ("gpt2", "llama-tied", "llama-untied", "llama3-rope"):
            ok &= hf_to_dscpp(a.dscpp, tmp, kind)
        for preset in ("gpt2-tiny", "llama-tiny", "llama3-rope"):
            for dtype in ("f32", "bf16"):
                ok &= dscpp_to_hf(a.dscpp, tmp, preset, dtype)
    print("all passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
