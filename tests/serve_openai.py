"""The official `openai` Python client against `sparsa serve` (run by tests/serve.rs).

usage: serve_openai.py BASE_URL API_KEY    (BASE_URL like http://127.0.0.1:8080/v1)

Streaming and not, chat and text completions, stop strings, seeds, usage counts, and the
client's own error classes for refused requests. Few, short requests: it runs in CI on lavapipe.
"""

import sys

import openai

base_url, key = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=120)
MODEL = "sparsa-bard-12m"


def check(cond, what):
    if not cond:
        raise SystemExit(f"FAILED: {what}")


models = client.models.list()
check([m.id for m in models.data] == [MODEL], f"models: {models}")

messages = [{"role": "user", "content": "Good morrow, sir. What news from the court?"}]
r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0)
reply = r.choices[0].message.content
check(r.object == "chat.completion", r)
check(r.choices[0].message.role == "assistant", r)
check(r.choices[0].finish_reason in ("stop", "length"), r)
check(r.usage.prompt_tokens > 5 and r.usage.completion_tokens >= 1, r.usage)
check(r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, r.usage)

# The stream gives the same reply, then a usage chunk.
parts, finish, usage = [], None, None
for chunk in client.chat.completions.create(
    model=MODEL,
    messages=messages,
    max_tokens=12,
    temperature=0,
    stream=True,
    stream_options={"include_usage": True},
):
    if chunk.usage is not None:
        usage = chunk.usage
    for c in chunk.choices:
        if c.delta.content:
            parts.append(c.delta.content)
        if c.finish_reason:
            finish = c.finish_reason
check("".join(parts).strip() == reply, f"stream {''.join(parts)!r} != {reply!r}")
check(finish == r.choices[0].finish_reason, finish)
check(usage is not None and usage.completion_tokens == r.usage.completion_tokens, usage)

# Text completions: max_tokens and usage; a stop string cuts the text before it.
c = client.completions.create(
    model=MODEL, prompt="ROMEO:", max_tokens=10, temperature=0, extra_body={"ignore_eos": True}
)
text = c.choices[0].text
check(c.choices[0].finish_reason == "length" and c.usage.completion_tokens == 10, c)
stop = text[3:6]
s = client.completions.create(
    model=MODEL,
    prompt="ROMEO:",
    max_tokens=10,
    temperature=0,
    stop=[stop],
    extra_body={"ignore_eos": True},
)
check(s.choices[0].text == text[: text.find(stop)], f"stop {stop!r}: {s.choices[0].text!r} of {text!r}")
check(s.choices[0].finish_reason == "stop", s)
streamed = "".join(
    ch.choices[0].text
    for ch in client.completions.create(
        model=MODEL,
        prompt="ROMEO:",
        max_tokens=10,
        temperature=0,
        stop=stop,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    if ch.choices
)
check(streamed == text[: text.find(stop)], f"streamed stop: {streamed!r}")

# Seeds reproduce samples.
def sample(seed):
    return client.completions.create(
        model=MODEL, prompt="KING:", max_tokens=10, temperature=1.0, seed=seed
    ).choices[0].text


check(sample(3) == sample(3), "the same seed gives the same text")

# Refusals arrive as the client's error classes.
try:
    client.chat.completions.create(model=MODEL, messages=messages, n=2)
    raise SystemExit("FAILED: n=2 was accepted")
except openai.BadRequestError as e:
    check("n=1" in str(e), e)
try:
    client.chat.completions.create(model="no-such-model", messages=messages, max_tokens=1)
    raise SystemExit("FAILED: an unknown model was accepted")
except openai.NotFoundError:
    pass
try:
    openai.OpenAI(base_url=base_url, api_key="wrong", max_retries=0).models.list()
    raise SystemExit("FAILED: a wrong key was accepted")
except openai.AuthenticationError:
    pass

print("openai client: all checks passed")
