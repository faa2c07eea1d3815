#!/usr/bin/env python3
"""Writes the seed corpora under fuzz/corpus/<target>/ from small synthetic files and from the
small real files in tests/data and models/. Run from the repository root:
    python3 fuzz/scripts/make_seeds.py
Needs numpy, safetensors and tokenizers (Python)."""
import json, os, struct
import numpy as np
from safetensors.numpy import save
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, normalizers, processors

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "fuzz", "corpus")
SEP = b"\0"
SHARD = b"\xffSPARSA-SHARD\xff"


def put(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def read(*p):
    with open(os.path.join(ROOT, *p), "rb") as f:
        return f.read()


def st(tensors, meta=None):
    return save(tensors, metadata=meta)


rng = np.random.default_rng(0)
f32 = lambda *s: rng.standard_normal(s).astype(np.float32)
f16 = lambda *s: rng.standard_normal(s).astype(np.float16)

# --- safetensors
put("safetensors", "norm_f32", st({"model.norm.weight": f32(8)}))
put("safetensors", "mixed", st({"a.weight": f32(2, 3), "b.bias": f16(4), "c": np.zeros((0, 3), np.float32),
                                 "ids": np.arange(3, dtype=np.int64)}, {"format": "pt"}))
put("safetensors", "two_shards", st({"x": f32(2)}) + SHARD + st({"y": f32(1, 2)}))
put("safetensors", "dup_across_shards", st({"x": f32(2)}) + SHARD + st({"x": f32(2)}))
hdr = b'{"t":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},"__metadata__":{"quant_method":"sparsa"}}'
put("safetensors", "handmade_bf16", struct.pack("<Q", len(hdr)) + hdr + b"\x80\x3f\x00\x40")
hdr = b'{"w":{"dtype":"F8_E4M3","shape":[2,2],"data_offsets":[0,4]}}'
put("safetensors", "handmade_fp8", struct.pack("<Q", len(hdr)) + hdr + b"\x38\x40\x7e\x00")

# --- shard_index
put("shard_index", "two_shards", json.dumps({"metadata": {"total_size": 48}, "weight_map": {
    "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
    "model.norm.weight": "model-00002-of-00002.safetensors",
    "lm_head.weight": "model-00002-of-00002.safetensors"}}, indent=2))
idx = json.loads(read("tests", "data", "dsv32-q8", "model.safetensors.index.json"))
idx["weight_map"] = dict(list(idx["weight_map"].items())[:12])
put("shard_index", "dsv32_q8_head", json.dumps(idx, indent=2))
put("shard_index", "bad_name", '{"weight_map": {"a": "../a.safetensors", "b": 3}}')

# --- config (config.json NUL generation_config.json)
for d in ["glm5", "glm52", "glm52-fp8", "glm52-q4", "dsv32", "dsv32-fp8", "dsv32-q8"]:
    put("config", d, read("tests", "data", d, "config.json") + SEP
        + read("tests", "data", d, "generation_config.json"))
put("config", "bard", read("models", "sparsa-bard-12m", "config.json"))

# --- quant_meta (config.json NUL safetensors)
def q8(n, k, block=32):
    w = rng.integers(-127, 128, (n, k), dtype=np.int8)
    s = (rng.random((n, (k + block - 1) // block)) + 0.5).astype(np.float32)
    bf = (s.view(np.uint32) >> 16).astype(np.uint16)  # bf16 bits
    return w, bf

w, s = q8(3, 40)
st_q8 = save({"l.weight": w, "l.weight_scale": s.view(np.uint16)}, metadata={
    "quant_method": "sparsa", "format": "q8", "block_size": "32"})
# The scale is BF16: rewrite the dtype in the header (numpy has no bfloat16).
def retype(blob, old, new):
    n = struct.unpack("<Q", blob[:8])[0]
    h = blob[8:8 + n].replace(old, new).rstrip(b" ")
    h = h + b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + blob[8 + n:]
st_q8 = retype(st_q8, b'"U16"', b'"BF16"')
put("quant_meta", "q8", json.dumps({"quantization_config": {"quant_method": "sparsa", "format": "q8",
                                                            "block_size": 32}}).encode() + SEP + st_q8)
w4 = rng.integers(0, 256, (2, 20), dtype=np.uint8)
s4 = (np.ones((2, 2), np.float32).view(np.uint32) >> 16).astype(np.uint16)
st_q4 = retype(save({"m.weight": w4, "m.weight_scale": s4}), b'"U16"', b'"BF16"')
put("quant_meta", "q4", json.dumps({"quantization_config": {"quant_method": "sparsa", "format": "q4",
                                                            "block_size": 32}}).encode() + SEP + st_q4)
w8 = rng.integers(0, 0x7e, (3, 5), dtype=np.uint8)
st_fp8 = retype(save({"f.weight": w8, "f.weight_scale_inv": np.ones((1, 1), np.float32)}), b'"U8"', b'"F8_E4M3"')
put("quant_meta", "fp8", json.dumps({"quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                                                             "weight_block_size": [128, 128]}}).encode() + SEP + st_fp8)
put("quant_meta", "glm52_q4_config", read("tests", "data", "glm52-q4", "config.json"))

# --- tokenizer
vocab = {c: i for i, c in enumerate(["<unk>", "a", "b", "c", "ab", "abc", " ", "Ġ", "h", "e", "l", "o", "he", "ll", "hell", "hello"])}
merges = [("a", "b"), ("ab", "c"), ("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o")]
t = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=False))
t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
t.decoder = decoders.ByteLevel()
t.add_special_tokens(["<|endoftext|>", "[gMASK]", "<sop>"])
t.post_processor = processors.TemplateProcessing(single="[gMASK] <sop> $A", special_tokens=[("[gMASK]", 16 + 1), ("<sop>", 16 + 2)])
put("tokenizer", "bpe_bytelevel", t.to_str(pretty=True))
t = Tokenizer(models.WordLevel(vocab={"<unk>": 0, "hello": 1, "world": 2}, unk_token="<unk>"))
t.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
t.pre_tokenizer = pre_tokenizers.Whitespace()
put("tokenizer", "wordlevel", t.to_str())
t = Tokenizer(models.Unigram([("<unk>", 0.0), ("▁", -1.0), ("h", -2.0), ("e", -2.0), ("llo", -1.5), ("▁he", -1.0)], 0, byte_fallback=False))
t.pre_tokenizer = pre_tokenizers.Metaspace()
t.decoder = decoders.Metaspace()
put("tokenizer", "unigram", t.to_str())
t = Tokenizer(models.WordPiece({"[UNK]": 0, "he": 1, "##llo": 2, "[CLS]": 3, "[SEP]": 4}, unk_token="[UNK]"))
t.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
t.decoder = decoders.WordPiece()
t.post_processor = processors.BertProcessing(("[SEP]", 4), ("[CLS]", 3))
put("tokenizer", "wordpiece", t.to_str())
t = Tokenizer(models.BPE(vocab={"<0x41>": 0, "<0xC3>": 1, "<0xA9>": 2, "▁": 3}, merges=[], byte_fallback=True))
t.pre_tokenizer = pre_tokenizers.Split(pattern="\\s+", behavior="isolated")
t.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
put("tokenizer", "byte_fallback_split", t.to_str())
bard = read("models", "sparsa-bard-12m", "tokenizer.json")
assert len(bard) < 1 << 20
put("tokenizer", "sparsa_bard_12m", bard)

# --- chat_template (tokenizer_config.json NUL chat_template.jinja)
chat = os.path.join("tests", "data", "chat")
put("chat_template", "deepseek_v32_exp", read(chat, "deepseek-v3.2-exp", "tokenizer_config.json"))
put("chat_template", "sparsa_bard_12m", read(chat, "sparsa-bard-12m", "tokenizer_config.json"))
put("chat_template", "glm_4_7", read(chat, "glm-4.7", "tokenizer_config.json") + SEP
    + read(chat, "glm-4.7", "chat_template.jinja"))
for f in sorted(os.listdir(os.path.join(ROOT, chat, "features"))):
    put("chat_template", "features_" + f.replace(".jinja", ""),
        b'{"bos_token": "<s>", "eos_token": {"content": "</s>"}}' + SEP + read(chat, "features", f))
put("chat_template", "list_default", json.dumps({"chat_template": [
    {"name": "tool_use", "template": "{{ tools }}"},
    {"name": "default", "template": "{% for m in messages %}{{ m.role }}: {{ m.content | tojson }}\n{% endfor %}"}]}))

# --- conversation (/load)
put("conversation", "saved", json.dumps({"messages": [
    {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!", "reasoning_content": "greeting"},
    {"role": "user", "content": "2+2?"}]}, indent=2))
put("conversation", "bare_list", '[{"role": "user", "content": "x\\u00e9\\ud83d\\ude42"}]')
put("conversation", "bad_message", '{"messages": [{"role": "user"}, 3]}')
