#!/usr/bin/env python3
"""Every parameter's gradient of a tiny GPT-2 and a tiny Llama against PyTorch (transformers, float64).

tests/torch_grads_dump runs one forward and backward in dscpp (f32, CPU) and exports the weights as a Hugging Face
folder and the gradients under the same names; here transformers loads the weights in float64, computes the same
mean cross-entropy on the same tokens, and its autograd gradients must match ours to within f32 rounding (Note
[Tolerance rule] in tests/test_ops.cpp). Skipped (exit 77, CTest's SKIP_RETURN_CODE) where torch or transformers is
not installed, as in CI: the only index CI reaches, PyPI, has torch's CUDA build alone (5.6 GB with its CUDA wheels).

Usage: python3 tests/python/test_torch_grads.py --dump build/tests/torch_grads_dump
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

try:
    import torch
    import torch.nn.functional as F
    import transformers
    from safetensors.torch import load_file
except ImportError as e:
    print(f"SKIP: needs torch and transformers ({e})")
    sys.exit(77)

# from_pretrained's dtype argument: `dtype` since transformers 4.56, `torch_dtype` before.
_TF_VERSION = tuple(int(x) for x in transformers.__version__.split(".")[:2] if x.isdigit())
DTYPE_F64 = {"dtype": torch.float64} if _TF_VERSION >= (4, 56) else {"torch_dtype": torch.float64}


def threshold(cfg, B, T):
    """As test_ops' rule: an f32 sum of K terms drifts by about eps*sqrt(K) (eps = 2^-23), 8*eps*sqrt(K) with the
    sums a gradient passes through adding in quadrature: per block, forward and backward, the norm (C), the
    projections (C and the MLP width F), attention (T keys, D per head); the head (C, V); the weight gradients' sums
    over the B*T tokens."""
    L = cfg.get("n_layer", cfg.get("num_hidden_layers"))
    C = cfg.get("n_embd", cfg.get("hidden_size"))
    H = cfg.get("n_head", cfg.get("num_attention_heads"))
    Fw = cfg.get("n_inner") or cfg.get("intermediate_size")
    V = cfg["vocab_size"]
    K = 2 * L * (4 * C + Fw + T + C // H) + C + V + B * T
    return 8 * 2.0**-23 * math.sqrt(K)


def check(folder, arch):
    with open(os.path.join(folder, "batch.json")) as f:
        batch = json.load(f)
    with open(os.path.join(folder, "weights", "config.json")) as f:
        cfg = json.load(f)
    tokens, targets = torch.tensor(batch["tokens"]), torch.tensor(batch["targets"])
    B, T = tokens.shape
    thr = threshold(cfg, B, T)
    model = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(folder, "weights"),
                                                              attn_implementation="eager", **DTYPE_F64)
    model.eval()  # no dropout; autograd works all the same
    logits = model(input_ids=tokens).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)
    loss.backward()
    ours = load_file(os.path.join(folder, "grads", "model.safetensors"))
    theirs = {n: p.grad for n, p in model.named_parameters()}  # a tied lm_head is listed once, as the embedding
    ok = True
    if set(ours) != set(theirs):
        print(f"FAIL {arch}: gradients only in dscpp {sorted(set(ours) - set(theirs))}, "
              f"only in transformers {sorted(set(theirs) - set(ours))}")
        ok = False
    loss_err = abs(batch["loss"] - loss.item()) / abs(loss.item())
    worst = (loss_err, "loss")
    ok &= loss_err <= thr
    for name in sorted(set(ours) & set(theirs)):
        got, want = ours[name].double(), theirs[name]
        err = ((got - want).norm() / want.norm()).item() if want.norm() > 0 else got.norm().item()
        if not err <= thr:
            print(f"FAIL {arch} {name}: normalised error {err:.3g} > threshold {thr:.3g}")
            ok = False
        worst = max(worst, (err, name))
    print(f"{'PASS' if ok else 'FAIL'} {arch}: loss {loss.item():.6f} (dscpp {batch['loss']:.6f}), {len(theirs)} "
          f"gradients; worst normalised error {worst[0]:.3g} ({worst[1]}), {100 * worst[0] / thr:.0f}% of the "
          f"threshold {thr:.3g}")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dump", required=True, help="the torch_grads_dump executable")
    a = ap.parse_args()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([a.dump, tmp], check=True)
        ok = all([check(os.path.join(tmp, arch), arch) for arch in ("gpt2", "llama")])
    print("all passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
