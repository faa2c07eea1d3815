#!/usr/bin/env python3
"""Expected chat-template renderings for sparsa, from transformers' own apply_chat_template.

Pinned version (exactly this; the script refuses to run with another):
    transformers==5.24.0   (it needs jinja2 >= 3.1.6, which transformers itself checks; torch is not needed)
Fresh machine (Python 3.11):
    pip install transformers==5.24.0
Run (from the repository root, a few seconds):
    python3 tests/reference/make_chat_refs.py        # writes tests/data/chat/expected.json

What it does: for every fixture under tests/data/chat/ (a directory with a tokenizer_config.json and
optionally a chat_template.jinja, laid out as a model directory is), it copies those files next to the
tokenizer.json of models/sparsa-bard-12m into a temporary directory, loads that directory with
AutoTokenizer.from_pretrained (so transformers itself reads the template, chat_template.jinja winning over
tokenizer_config.json, and the special tokens), and renders each conversation of the fixture with
tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=..., **extra).
The templates under tests/data/chat/features/ are small templates of ours that exercise the places where
Jinja2 and MiniJinja differ; they are rendered the same way with sparsa-bard-12m's tokenizer_config.json
and the feature template as its chat_template.jinja. A case whose rendering raises records the error
message instead of a rendering.

Output: tests/data/chat/expected.json = {"transformers": version, "jinja2": version, "cases": [
    {"fixture", "case", "messages", "add_generation_prompt", "extra", "rendered" | "error"}, ...]}
For sparsa-bard-12m (whose tokenizer.json is the one used) a case also has "input_ids", from
apply_chat_template(..., tokenize=True), which encodes the rendering without adding special tokens.
"""
import argparse
import json
import os
import shutil
import tempfile

import common  # (its version check and paths work without torch)

PINS = {"transformers": common.PINNED["transformers"]}
CHAT = os.path.join(common.DATA, "chat")
TOKENIZER_JSON = os.path.join(common.REPO, "models", "sparsa-bard-12m", "tokenizer.json")
BARD_CONFIG = os.path.join(CHAT, "sparsa-bard-12m", "tokenizer_config.json")


def msg(role, content, reasoning=None):
    m = {"role": role, "content": content}
    if reasoning is not None:
        m["reasoning_content"] = reasoning
    return m


SYSTEM = msg("system", "You are a helpful assistant.")
UNICODE = "héllo 你好 🎉 — “quotes” 'single' \\back\\slash\ttab\u2028sep"
GLM_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Wetter für eine Stadt — «current» weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "名字"},
                                                     "days": {"type": "integer", "minimum": 1}},
                   "required": ["city"]}}}]

# (case name, messages, add_generation_prompt, extra kwargs)
COMMON = [
    ("single_user", [msg("user", "Hello")], True, {}),
    ("single_user_no_gen", [msg("user", "Hello")], False, {}),
    ("system_user", [SYSTEM, msg("user", "What is 2+2?")], True, {}),
    ("multi_turn", [SYSTEM, msg("user", "What is 2+2?"), msg("assistant", "4"), msg("user", "And 3+3?")], True, {}),
    ("multi_turn_no_gen", [msg("user", "What is 2+2?"), msg("assistant", "4")], False, {}),
    ("unicode", [msg("user", UNICODE), msg("assistant", "ok 👍 ✓"), msg("user", "ñ")], True, {}),
    ("empty_content", [msg("user", ""), msg("assistant", ""), msg("user", "")], True, {}),
    ("whitespace_content", [msg("user", "  padded \n"), msg("assistant", "\n\n  spaced answer  \n"),
                            msg("user", "\tnext")], True, {}),
    ("special_token_text", [msg("user", "<|user|> [gMASK] <｜User｜> </think> {{ not a template }}")], True, {}),
]
REASONING = [
    ("reasoning_history", [msg("user", "1+1?"), msg("assistant", "2", "simple arithmetic"),
                           msg("user", "2+2?")], True, {}),
    ("reasoning_last", [msg("user", "1+1?"), msg("assistant", "2", "  simple arithmetic\n")], False, {}),
    ("think_tags_in_content", [msg("user", "q"), msg("assistant", "<think>\nhmm\n</think>\n\nAnswer"),
                               msg("user", "again")], True, {}),
    ("think_tags_last", [msg("user", "q"), msg("assistant", "<think>\nhmm\n</think>\n\nAnswer")], False, {}),
    ("empty_reasoning", [msg("user", "q"), msg("assistant", "a", "")], False, {}),
]
FIXTURES = {
    "glm-4.7": COMMON + REASONING + [
        ("enable_thinking_true", [msg("user", "Hi")], True, {"enable_thinking": True}),
        ("enable_thinking_false", [msg("user", "Hi")], True, {"enable_thinking": False}),
        ("enable_thinking_false_history", [msg("user", "1+1?"), msg("assistant", "2", "sum"), msg("user", "x")],
         True, {"enable_thinking": False}),
        ("clear_thinking_false", [msg("user", "1+1?"), msg("assistant", "2", "sum"), msg("user", "x")],
         True, {"clear_thinking": False}),
        ("tools", [SYSTEM, msg("user", "Weather in Oslo?")], True, {"tools": GLM_TOOLS}),
    ],
    "deepseek-v3.2-exp": COMMON + REASONING + [
        ("thinking_true", [msg("user", "Hi")], True, {"thinking": True}),
        ("thinking_false", [msg("user", "Hi")], True, {"thinking": False}),
        ("thinking_true_history", [SYSTEM, msg("user", "1+1?"), msg("assistant", "2", "sum"), msg("user", "x")],
         True, {"thinking": True}),
        ("enable_thinking_ignored", [msg("user", "Hi")], True, {"enable_thinking": True}),
        ("two_system_messages", [SYSTEM, msg("system", "Be brief."), msg("user", "Hi")], True, {}),
        ("only_system", [SYSTEM], True, {}),
    ],
    "sparsa-bard-12m": COMMON + [
        ("extra_kwarg_unused", [msg("user", "Hi")], True, {"enable_thinking": False}),
    ],
}
FEATURE_CONVERSATION = [SYSTEM, msg("user", "first"), msg("assistant", "reply"), msg("user", "second"),
                        msg("assistant", "more"), msg("user", "third")]
PAYLOAD = {"name": "Zoë", "quote": "say \"hi\"\n\ttab \\ slash", "emoji": "🎉", "ctrl": "\u0001\u001f\u007f",
           "sep": "\u2028", "numbers": [0, -3, 2.5, 1e20, 1e-7, 0.1, 123456789012, 3.0], "nested": {"b": [], "a": {}},
           "flags": [True, False, None], "zz": 1, "aa": 2}
FEATURES = {
    "values": [("values", [msg("user", "x")], True,
                {"flag": True, "nothing": None, "count": 3, "ratio": 0.5, "big": 12345678901234,
                 "items": ["a", 1, None, True, 2.5, {"k": "v"}], "mapping": {"k": "v", "n": [1, 2]}, "text": "t",
                 "tiny": 1e-7, "huge": 1e20})],
    "tojson": [("tojson", [msg("user", "x")], True, {"payload": PAYLOAD})],
    "strings": [("strings", [msg("user", "x")], True, {"ws": "\x1c\u2003 a b\x1f\n"})],
    "control": [("control", FEATURE_CONVERSATION, True, {})],
    "whitespace": [("whitespace_gen", FEATURE_CONVERSATION[:3], True, {}),
                   ("whitespace_no_gen", FEATURE_CONVERSATION[:3], False, {})],
    "generation": [("generation", FEATURE_CONVERSATION[:3], True, {})],
    "raise": [("raise_ok", FEATURE_CONVERSATION[:3], False, {}),
              ("raise_unknown_role", [msg("user", "x"), msg("tool", "y")], False, {})],
}


def render(fixture_dir, files, cases, fixture):
    from transformers import AutoTokenizer
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(TOKENIZER_JSON, os.path.join(tmp, "tokenizer.json"))
        for src, name in files:
            shutil.copy(src, os.path.join(tmp, name))
        tok = AutoTokenizer.from_pretrained(tmp)
        for name, messages, gen, extra in cases:
            case = {"fixture": fixture, "case": name, "messages": messages, "add_generation_prompt": gen,
                    "extra": extra}
            try:
                case["rendered"] = tok.apply_chat_template(
                    [dict(m) for m in messages], tokenize=False, add_generation_prompt=gen, **extra)
                if fixture == "sparsa-bard-12m":  # the real model: also the token ids
                    case["input_ids"] = tok.apply_chat_template(
                        [dict(m) for m in messages], tokenize=True, return_dict=False,
                        add_generation_prompt=gen, **extra)
            except Exception as e:  # the template raised: keep the message
                case["error"] = "%s: %s" % (type(e).__name__, e)
            out.append(case)
    return out


def main():
    argparse.ArgumentParser(description=__doc__.strip().split("\n\n")[0]).parse_args()  # (no flags; --help)
    common.check_versions(PINS)
    import jinja2
    import transformers
    cases = []
    for fixture, fixture_cases in FIXTURES.items():
        d = os.path.join(CHAT, fixture)
        files = [(os.path.join(d, f), f) for f in ("tokenizer_config.json", "chat_template.jinja")
                 if os.path.exists(os.path.join(d, f))]
        cases += render(d, files, fixture_cases, fixture)
    for feature, feature_cases in FEATURES.items():
        path = os.path.join(CHAT, "features", feature + ".jinja")
        files = [(BARD_CONFIG, "tokenizer_config.json"), (path, "chat_template.jinja")]
        cases += render(os.path.dirname(path), files, feature_cases, "features/" + feature)
    doc = {"transformers": transformers.__version__, "jinja2": jinja2.__version__, "cases": cases}
    path = os.path.join(CHAT, "expected.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote %s: %d cases (%d raised)" % (path, len(cases), sum("error" in c for c in cases)))


if __name__ == "__main__":
    main()
