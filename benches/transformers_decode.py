#!/usr/bin/env python3
"""Decode and prefill speed of Hugging Face transformers on a sparsa model directory, for
BENCHMARKS.md's side-by-side numbers (same synthetic model, same GPU, same run).

    python3 benches/transformers_decode.py --model DIR --contexts 512,4096 --decode 16 --json out.json

bf16 weights on CUDA (f32 with --device cpu) with the sdpa attention implementation (eager where the model has no
sdpa path). Context L: a prefill of L random tokens (timed: prefill tok/s), then --decode
single-token steps with the KV cache, each timed with torch.cuda.synchronize (median ms).
An out-of-memory error is recorded as such and the next context is tried.
"""
import argparse, json, statistics, sys, time

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--contexts", default="512,4096")
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--device", default="cuda", help="cuda (bf16) or cpu (f32)")
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.manual_seed(0)
    cfg = AutoConfig.from_pretrained(a.model)
    cuda = a.device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    # device_map needs `accelerate`; on the CPU the model is loaded where it runs anyway.
    placement = {"device_map": "cuda"} if cuda else {}

    def sync():
        if cuda:
            torch.cuda.synchronize()
    t0 = time.time()
    try:
        model = AutoModelForCausalLM.from_pretrained(
            a.model, dtype=dtype, attn_implementation=a.attn, **placement)
        attn = a.attn
    except (ValueError, NotImplementedError) as e:
        print(f"attn {a.attn} unavailable ({e}); using eager", file=sys.stderr)
        model = AutoModelForCausalLM.from_pretrained(
            a.model, dtype=dtype, attn_implementation="eager", **placement)
        attn = "eager"
    model.eval()
    load_s = time.time() - t0
    out = {"transformers": transformers.__version__, "torch": torch.__version__,
           "device": torch.cuda.get_device_name(0) if cuda else "cpu", "threads": torch.get_num_threads(), "attn": attn, "load_s": load_s,
           "params": sum(p.numel() for p in model.parameters()), "results": []}
    print(f"loaded in {load_s:.1f}s: {out['params']/1e9:.2f}B params, attn={attn}", file=sys.stderr)
    vocab = min(cfg.vocab_size, 6144)
    for ctx in [int(c) for c in a.contexts.split(",") if c]:
        r = {"context": ctx}
        try:
            ids = torch.randint(0, vocab, (1, ctx), device=a.device)
            sync()
            t = time.time()
            with torch.no_grad():
                o = model(input_ids=ids, use_cache=True)
            sync()
            r["prefill_s"] = time.time() - t
            r["prefill_tok_s"] = ctx / r["prefill_s"]
            past = o.past_key_values
            tok = o.logits[:, -1:].argmax(-1)
            del o
            times = []
            with torch.no_grad():
                for i in range(a.decode + 2):
                    sync()
                    t = time.time()
                    o = model(input_ids=tok, past_key_values=past, use_cache=True)
                    tok = o.logits[:, -1:].argmax(-1)
                    sync()
                    if i >= 2:
                        times.append((time.time() - t) * 1e3)
                    past = o.past_key_values
            r["decode_ms_median"] = statistics.median(times)
            r["decode_ms_min"] = min(times)
            if cuda:
                r["peak_mem_gb"] = torch.cuda.max_memory_allocated() / 1e9
        except torch.OutOfMemoryError as e:
            r["error"] = "out of memory: " + str(e).splitlines()[0][:200]
        print(json.dumps(r), file=sys.stderr)
        out["results"].append(r)
        past = None
        if cuda:
            torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
