#!/usr/bin/env python3
"""PyTorch twin of bench/inference_bench.cpp: Hugging Face generate on the same shapes with random weights.

transformers' LlamaForCausalLM built from a config.json (bench/models/*.json; no downloads), bf16 on one GPU; B
prompts of --prompt random tokens, greedy, exactly --new tokens each (min_new_tokens = max_new_tokens). Modes:
  static:  cache_implementation="static" (a preallocated KV cache), eager (disable_compile);
  compile: the same, compiled the way generate does it by itself for a static cache (torch.compile,
           mode "reduce-overhead": CUDA graphs), Hugging Face's recipe for fast decoding.
Prints one tab-separated line per (batch, mode), prefixed RESULT, with the columns of inference_bench:
  RESULT impl model B prompt new tokens_per_s ms_per_decode_step forwards peak_mem_gib
"""
import argparse
import json
import os
import sys
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True, help="a config.json, or a folder holding one")
    p.add_argument("--batch", default="1,32")
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--modes", default="static,compile")
    a = p.parse_args()
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = a.model if a.model.endswith(".json") else os.path.join(a.model, "config.json")
    cfg = LlamaConfig(**json.load(open(path)))
    name = os.path.splitext(os.path.basename(path))[0] if a.model.endswith(".json") else os.path.basename(a.model)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    for mode in a.modes.split(","):
        for B in [int(x) for x in a.batch.split(",")]:
            ids = torch.randint(0, cfg.vocab_size, (B, a.prompt), device="cuda")
            kw = dict(max_new_tokens=a.new, min_new_tokens=a.new, do_sample=False, cache_implementation="static",
                      pad_token_id=0, disable_compile=(mode != "compile"))
            try:
                torch.cuda.reset_peak_memory_stats()
                for _ in range(a.warmup):
                    model.generate(ids, **kw)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                out = model.generate(ids, **kw)
                torch.cuda.synchronize()
                secs = time.perf_counter() - t0
                assert out.shape[1] == a.prompt + a.new
                peak = torch.cuda.max_memory_allocated() / 2**30
                print(f"RESULT\ttorch-{mode}\t{name}\t{B}\t{a.prompt}\t{a.new}\t{B * a.new / secs:.1f}\t"
                      f"{1e3 * secs / a.new:.3f}\t{a.new}\t{peak:.2f}", flush=True)
            except torch.OutOfMemoryError:
                print(f"RESULT\ttorch-{mode}\t{name}\t{B}\t{a.prompt}\t{a.new}\tOOM\tOOM\tOOM\tOOM", flush=True)


if __name__ == "__main__":
    sys.exit(main())
