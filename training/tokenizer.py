#!/usr/bin/env python3
"""Byte-level BPE tokenizer for the sparsa demo model, GLM-style special tokens and chat template, plus the
pre-tokenised id streams that train.py / evaluate.py read.

Pinned: tokenizers==0.23.3  transformers==5.24.0 (only to check that AutoTokenizer loads the result)  numpy==2.4.6
Run:    python3 training/tokenizer.py     # after data.py; -> training/work/tokenizer/, training/work/tokens/

Vocabulary: 6144 ids = 12 special tokens (ids 0-11) + 256 byte symbols + BPE merges learnt on train.txt and the
chat turns (held-out works are never seen). Specials follow GLM-4/5: `<|endoftext|>` (pad and eos), `[MASK]`,
`[gMASK]`, `[sMASK]`, `<sop>`, `<eop>`, `<|system|>`, `<|user|>`, `<|assistant|>`, `<|observation|>`,
`<think>`, `</think>`. Encoding a plain string prepends `[gMASK]<sop>` (post-processor), which is also how the
chat template starts, so plain completion = `tokenizer(text)`, chat = `apply_chat_template(...)`.
Streams: every document (a work, or a chat conversation rendered by the template without its `[gMASK]<sop>`
prefix) ends with `<|endoftext|>`; train.py prepends `[gMASK]<sop>` to every training window.
"""
import json
import os
import sys

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "work", "data")
TOKDIR = os.path.join(HERE, "work", "tokenizer")
TOKENS = os.path.join(HERE, "work", "tokens")
VOCAB = 6144
SPECIALS = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
            "<|assistant|>", "<|observation|>", "<think>", "</think>"]
# GLM-style: "[gMASK]<sop>" then "<|role|>\n" + content per message; generation prompt "<|assistant|>\n".
CHAT_TEMPLATE = (
    "[gMASK]<sop>"
    "{%- for message in messages -%}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|assistant|>\n' }}{%- endif -%}"
)
SEP = "\n<|endoftext|>\n"


def render_chat_body(conv):
    """The template's output without the [gMASK]<sop> prefix (a conversation inside the training stream)."""
    return "".join(f"<|{m['role']}|>\n{m['content']}" for m in conv)


def main():
    train_docs = open(os.path.join(DATA, "train.txt")).read().split(SEP)
    held_docs = open(os.path.join(DATA, "heldout.txt")).read().split(SEP)
    convs = [json.loads(l) for l in open(os.path.join(DATA, "chat.jsonl"))]

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)

    def corpus():
        yield from train_docs
        for c in convs:
            for m in c:
                yield m["content"]

    tok.train_from_iterator(corpus(), trainer=trainer)
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    tok.post_processor = processors.TemplateProcessing(
        single="[gMASK] <sop> $A", pair="[gMASK] <sop> $A $B",
        special_tokens=[("[gMASK]", SPECIALS.index("[gMASK]")), ("<sop>", SPECIALS.index("<sop>"))])
    os.makedirs(TOKDIR, exist_ok=True)
    tok.save(os.path.join(TOKDIR, "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 2048,
        "padding_side": "left",
        "clean_up_tokenization_spaces": False,
        "do_lower_case": False,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "additional_special_tokens": SPECIALS[1:],
        "added_tokens_decoder": {str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                                          "single_word": False, "special": True} for i, s in enumerate(SPECIALS)},
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(TOKDIR, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")

    # id streams (no [gMASK]<sop>: train.py adds it per window)
    eot = SPECIALS.index("<|endoftext|>")
    os.makedirs(TOKENS, exist_ok=True)

    def stream(docs):
        out = []
        for enc in tok.encode_batch(docs, add_special_tokens=False):
            out.extend(enc.ids)
            out.append(eot)
        return np.array(out, dtype=np.uint16)

    tr = stream([d.strip("\n") + "\n" for d in train_docs])
    ho = stream([d.strip("\n") + "\n" for d in held_docs])
    ch = stream([render_chat_body(c) for c in convs])
    np.save(os.path.join(TOKENS, "train.npy"), tr)
    np.save(os.path.join(TOKENS, "heldout.npy"), ho)
    np.save(os.path.join(TOKENS, "chat.npy"), ch)
    stats = {"vocab": VOCAB, "train_tokens": int(tr.size), "heldout_tokens": int(ho.size), "chat_tokens": int(ch.size),
             "train_chars_per_token": round(sum(len(d) for d in train_docs) / tr.size, 3)}
    json.dump(stats, open(os.path.join(TOKENS, "stats.json"), "w"), indent=1)
    print(json.dumps(stats))

    # check: transformers loads it, the template renders, round trip
    try:
        from transformers import AutoTokenizer
    except ImportError:
        return
    t = AutoTokenizer.from_pretrained(TOKDIR)
    ids = t("To be, or not to be").input_ids
    assert ids[:2] == [2, 4] and t.decode(ids, skip_special_tokens=True) == "To be, or not to be", ids
    msgs = [{"role": "user", "content": "Who's there?"}]
    s = t.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert s == "[gMASK]<sop><|user|>\nWho's there?<|assistant|>\n", repr(s)
    ids2 = t.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
    ids2 = ids2["input_ids"] if isinstance(ids2, dict) or hasattr(ids2, "keys") else ids2
    assert ids2[:3] == [2, 4, 7] and ids2[-2] == 8, ids2
    print("template ok:", repr(s), ids2)


if __name__ == "__main__":
    sys.exit(main())
