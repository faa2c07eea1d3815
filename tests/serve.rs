//! `sparsa serve` end to end on loopback with the built-in model: the OpenAI endpoints
//! (streaming and not), stop strings across token boundaries, seeds, usage counts, the prefix
//! cache, concurrent clients with disconnects (greedy outputs equal the same prompt run
//! alone), hostile requests, the queue limit, shutdown, the official `openai` Python
//! client (tests/serve_openai.py), and `--draft`'s speculative rounds (greedy replies
//! unchanged).

mod common;

use common::bin;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A running `sparsa serve --port 0`, killed when dropped.
struct Server {
    child: Child,
    addr: String,
    log: mpsc::Receiver<String>,
}

impl Server {
    fn start(args: &[&str]) -> Server {
        let mut child = bin()
            .args(["serve", "--port", "0"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let err = child.stderr.take().unwrap();
        let (tx, log) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(|l| l.ok()) {
                let _ = tx.send(line);
            }
        });
        let t0 = Instant::now();
        let mut seen = Vec::new();
        let addr = loop {
            match log.recv_timeout(Duration::from_secs(1)) {
                Ok(l) => {
                    if let Some(a) = l.strip_prefix("listening on http://") {
                        break a.to_string();
                    }
                    seen.push(l);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    panic!("sparsa serve exited before listening: {seen:?}")
                }
            }
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "not listening after 120 s: {seen:?}"
            );
        };
        Server { child, addr, log }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// One request; `Connection: close`, so the reply ends with the connection.
    fn raw(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Reply {
        raw_to(&self.addr, method, path, headers, body)
    }

    fn post(&self, path: &str, body: &Value) -> Reply {
        post_to(&self.addr, path, body)
    }

    fn get(&self, path: &str) -> Reply {
        self.raw("GET", path, &[], b"")
    }

    fn health(&self) -> Value {
        self.get("/health").json()
    }

    /// Waits until no request is running or queued.
    fn wait_idle(&self) {
        let t0 = Instant::now();
        loop {
            let h = self.health();
            if h["slots_busy"] == 0 && h["queued"] == 0 {
                return;
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "never idle: {h}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// One HTTP request to `addr` (a connection of its own); the whole reply.
fn raw_to(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Reply {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n",
        addr,
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    // A server that answers before reading a large body may close first.
    let _ = s.write_all(body);
    let mut bytes = Vec::new();
    let _ = s.read_to_end(&mut bytes);
    Reply::parse(&bytes)
}

fn post_to(addr: &str, path: &str, body: &Value) -> Reply {
    raw_to(
        addr,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    )
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Reply {
    status: u16,
    headers: String,
    body: Vec<u8>,
}

impl Reply {
    fn parse(bytes: &[u8]) -> Reply {
        let end = bytes
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .unwrap_or_else(|| panic!("no HTTP head in {:?}", String::from_utf8_lossy(bytes)));
        let head = String::from_utf8_lossy(&bytes[..end]).to_string();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        let mut body = bytes[end + 4..].to_vec();
        if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            body = dechunk(&body);
        }
        Reply {
            status,
            headers: head,
            body,
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).to_string()
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    /// The `data:` payloads of a server-sent event stream (the last one is `[DONE]`).
    fn events(&self) -> Vec<String> {
        self.text()
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .map(str::to_string)
            .collect()
    }

    /// An OpenAI error of status `status`; its message.
    fn error(&self, status: u16) -> String {
        assert_eq!(self.status, status, "{}", self.text());
        let v = self.json();
        let e = &v["error"];
        assert!(e["message"].is_string(), "{v}");
        assert!(e["type"].is_string(), "{v}");
        assert!(
            e.as_object().unwrap().contains_key("param")
                && e.as_object().unwrap().contains_key("code"),
            "{v}"
        );
        e["message"].as_str().unwrap().to_string()
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(i) = b.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let n = usize::from_str_radix(String::from_utf8_lossy(&b[..i]).trim(), 16).unwrap_or(0);
        if n == 0 || b.len() < i + 2 + n {
            return out;
        }
        out.extend_from_slice(&b[i + 2..i + 2 + n]);
        b = &b[(i + 4 + n).min(b.len())..];
    }
}

/// The text and finish reason of a streamed completion or chat (content and reasoning), with
/// the usage chunk when there is one.
struct Streamed {
    text: String,
    reasoning: String,
    finish: String,
    usage: Option<Value>,
}

fn streamed(r: &Reply) -> Streamed {
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.headers.contains("text/event-stream"), "{}", r.headers);
    let ev = r.events();
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"), "{ev:?}");
    let mut s = Streamed {
        text: String::new(),
        reasoning: String::new(),
        finish: String::new(),
        usage: None,
    };
    for e in &ev[..ev.len() - 1] {
        let v: Value = serde_json::from_str(e).unwrap();
        assert!(v.get("error").is_none(), "{v}");
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            s.usage = Some(u.clone());
        }
        let Some(c) = v["choices"].get(0) else {
            continue;
        };
        if let Some(t) = c["text"].as_str() {
            s.text.push_str(t);
        }
        if let Some(t) = c["delta"]["content"].as_str() {
            s.text.push_str(t);
        }
        if let Some(t) = c["delta"]["reasoning_content"].as_str() {
            s.reasoning.push_str(t);
        }
        if let Some(f) = c["finish_reason"].as_str() {
            s.finish = f.to_string();
        }
    }
    s
}

fn completion(srv: &Server, body: Value) -> (String, String, Value) {
    completion_at(&srv.addr, body)
}

fn completion_at(addr: &str, body: Value) -> (String, String, Value) {
    let r = post_to(addr, "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    let c = &v["choices"][0];
    (
        c["text"].as_str().unwrap().to_string(),
        c["finish_reason"].as_str().unwrap().to_string(),
        v["usage"].clone(),
    )
}

const PROMPTS: [&str; 4] = [
    "ROMEO:",
    "KING RICHARD:\nWhat news",
    "Now is the winter of our discontent",
    "HAMLET:\nTo be, or not to be",
];

#[test]
fn serve_end_to_end() {
    let srv = Server::start(&["--parallel", "4", "--queue", "8"]);
    let h = srv.health();
    assert_eq!(h["status"], "ok", "{h}");
    assert_eq!(h["slots"], 4);
    let models = srv.get("/v1/models").json();
    assert_eq!(models["data"][0]["id"], "sparsa-bard-12m", "{models}");

    // Greedy completions, each alone: the reference for everything below.
    let solo: Vec<String> = PROMPTS
        .iter()
        .map(|p| {
            let (text, finish, usage) = completion(
                &srv,
                json!({"prompt": p, "max_tokens": 12, "temperature": 0, "ignore_eos": true}),
            );
            assert_eq!(finish, "length");
            assert_eq!(usage["completion_tokens"], 12, "{usage}");
            assert_eq!(
                usage["total_tokens"].as_u64(),
                Some(usage["prompt_tokens"].as_u64().unwrap() + 12)
            );
            text
        })
        .collect();
    assert!(solo.iter().all(|t| !t.is_empty()), "{solo:?}");

    // The same through the stream: the same text, usage at the end, then [DONE].
    let r = srv.post(
        "/v1/completions",
        &json!({"prompt": PROMPTS[0], "max_tokens": 12, "temperature": 0, "ignore_eos": true,
                "stream": true, "stream_options": {"include_usage": true}}),
    );
    let s = streamed(&r);
    assert_eq!(s.text, solo[0]);
    assert_eq!(s.finish, "length");
    let u = s.usage.expect("a usage chunk");
    assert_eq!(u["completion_tokens"], 12, "{u}");

    // Token ids in, and the prefix cache: the same prompt again reuses all but its last token.
    let ids: Vec<u32> = vec![2, 4, 100, 200, 300, 400];
    let (a, _, ua) = completion(
        &srv,
        json!({"prompt": ids, "max_tokens": 4, "temperature": 0, "ignore_eos": true}),
    );
    assert_eq!(ua["prompt_tokens"], 6);
    let (b, _, ub) = completion(
        &srv,
        json!({"prompt": [ids], "max_tokens": 4, "temperature": 0, "ignore_eos": true}),
    );
    assert_eq!(a, b);
    assert_eq!(ub["prompt_tokens_details"]["cached_tokens"], 5, "{ub}");

    // Stop strings across token boundaries: a stop made of the end of one token and the
    // start of the next cuts the text there, in the stream too, and is never shown.
    let full = &solo[2];
    let sp = full
        .char_indices()
        .position(|(i, c)| c == ' ' && i >= 1 && i + 2 <= full.len())
        .expect("a space inside the text");
    let sp = full.char_indices().nth(sp).unwrap().0;
    let stop = &full[sp - 1..sp + 2];
    let want = &full[..full.find(stop).unwrap()];
    let (t, f, _) = completion(
        &srv,
        json!({"prompt": PROMPTS[2], "max_tokens": 12, "temperature": 0, "ignore_eos": true,
                "stop": [stop, "never seen"]}),
    );
    assert_eq!((t.as_str(), f.as_str()), (want, "stop"), "stop {stop:?}");
    let r = srv.post(
        "/v1/completions",
        &json!({"prompt": PROMPTS[2], "max_tokens": 12, "temperature": 0, "ignore_eos": true,
                "stop": stop, "stream": true}),
    );
    let s = streamed(&r);
    assert_eq!(s.text, want, "stop {stop:?}");
    assert_eq!(s.finish, "stop");
    // A stop string split across every token boundary of the text: no piece of it is ever
    // sent, even when the text before it is held back over several tokens.
    let long_stop = &full[1..full.len().min(10)];
    let r = srv.post(
        "/v1/completions",
        &json!({"prompt": PROMPTS[2], "max_tokens": 12, "temperature": 0, "ignore_eos": true,
                "stop": long_stop, "stream": true}),
    );
    let s = streamed(&r);
    assert_eq!(s.text, &full[..full.find(long_stop).unwrap()]);

    // Seeds: the same seed gives the same sample, on the GPU's sampler (top-k 40) and the
    // host's (top-k 0, min-p, penalties); another seed another one.
    for extra in [
        json!({"top_k": 40}),
        json!({"top_k": 0, "min_p": 0.05, "presence_penalty": 0.5, "frequency_penalty": 0.2}),
    ] {
        let mut body =
            json!({"prompt": PROMPTS[1], "max_tokens": 16, "temperature": 1.2, "ignore_eos": true});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let run = |seed: u64| {
            let mut b = body.clone();
            b["seed"] = json!(seed);
            completion(&srv, b).0
        };
        let (x, y, z) = (run(7), run(7), run(8));
        assert_eq!(x, y, "{extra}");
        assert_ne!(x, z, "{extra}: seeds 7 and 8 gave the same 16 tokens");
    }

    // Chat, with and without streaming: the same reply, usage, role.
    let chat = json!({"model": "sparsa-bard-12m", "temperature": 0, "max_tokens": 16,
        "messages": [{"role": "system", "content": "Speak."},
                     {"role": "user", "content": "Good morrow, sir. What news from the court?"}]});
    let r = srv.post("/v1/chat/completions", &chat);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    let m = &v["choices"][0]["message"];
    assert_eq!(m["role"], "assistant");
    let reply = m["content"].as_str().unwrap().to_string();
    let finish = v["choices"][0]["finish_reason"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(finish == "stop" || finish == "length", "{v}");
    let usage = &v["usage"];
    assert!(usage["prompt_tokens"].as_u64().unwrap() > 10, "{usage}");
    // The next turn of that conversation prefills only what is new: its prompt starts with
    // the first turn's prompt and reply, which a slot's caches hold.
    let mut next = chat.clone();
    next["messages"].as_array_mut().unwrap().extend([
        json!({"role": "assistant", "content": reply}),
        json!({"role": "user", "content": "Speak again."}),
    ]);
    let r = srv.post("/v1/chat/completions", &next);
    assert_eq!(r.status, 200, "{}", r.text());
    let u2 = r.json()["usage"].clone();
    assert!(
        u2["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            >= usage["prompt_tokens"].as_u64().unwrap(),
        "second turn {u2}, first {usage}"
    );
    let mut sc = chat.clone();
    sc["stream"] = json!(true);
    let s = streamed(&srv.post("/v1/chat/completions", &sc));
    assert_eq!(s.text.trim(), reply);
    assert_eq!(s.finish, finish);

    // Concurrency: 8 clients on 4 slots, some hanging up mid-stream or before a non-streamed
    // reply. Every request completes or is cancelled, the greedy outputs equal the runs
    // alone, and the slots are free again afterwards. Two rounds with different hang-ups;
    // the server's memory does not grow from the first to the second.
    let round = |r: usize| {
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let addr = srv.addr.clone();
                let prompt = PROMPTS[i % 4].to_string();
                std::thread::spawn(move || {
                    let stream = i != 5;
                    let body = json!({"prompt": prompt, "max_tokens": 12, "temperature": 0,
                                      "ignore_eos": true, "stream": stream})
                    .to_string();
                    let mut s = TcpStream::connect(&addr).unwrap();
                    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
                    write!(
                        s,
                        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    )
                    .unwrap();
                    if (i + r) % 3 == 1 {
                        // Hang up after the first bytes of the stream, or before the reply.
                        if stream {
                            let mut buf = [0u8; 64];
                            let _ = s.read(&mut buf);
                        } else {
                            std::thread::sleep(Duration::from_millis(300));
                        }
                        return None;
                    }
                    let mut bytes = Vec::new();
                    s.read_to_end(&mut bytes).unwrap();
                    let reply = Reply::parse(&bytes);
                    Some(if stream {
                        streamed(&reply).text
                    } else {
                        reply.json()["choices"][0]["text"].as_str().unwrap().to_string()
                    })
                })
            })
            .collect();
        let mut done = 0;
        for (i, h) in handles.into_iter().enumerate() {
            if let Some(text) = h.join().unwrap() {
                assert_eq!(text, solo[i % 4], "round {r}, client {i}");
                done += 1;
            }
        }
        assert!(done >= 5, "round {r}: {done} completed");
        srv.wait_idle();
    };
    let rss = || -> Option<u64> {
        let s = std::fs::read_to_string(format!("/proc/{}/status", srv.child.id())).ok()?;
        let kb = s.lines().find(|l| l.starts_with("VmRSS:"))?;
        kb.split_whitespace().nth(1)?.parse().ok()
    };
    round(0);
    let after_one = rss();
    round(1);
    if let (Some(a), Some(b)) = (after_one, rss()) {
        assert!(
            b < a + 32 * 1024,
            "RSS grew from {a} kB to {b} kB over a round"
        );
    }
    // A long request whose client goes away frees its slot at once (not after its 900
    // tokens, which take over a minute here), streamed or not.
    for stream in [true, false] {
        let body = json!({"prompt": "ROMEO:", "max_tokens": 900, "temperature": 0,
                          "ignore_eos": true, "stream": stream})
        .to_string();
        let mut s = TcpStream::connect(&srv.addr).unwrap();
        write!(
            s,
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let t0 = Instant::now();
        while srv.health()["slots_busy"] != 1 {
            assert!(t0.elapsed() < Duration::from_secs(30));
            std::thread::sleep(Duration::from_millis(10));
        }
        if stream {
            let mut buf = [0u8; 64];
            let _ = s.read(&mut buf);
        }
        drop(s);
        let t0 = Instant::now();
        srv.wait_idle();
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "cancelled after {:?} (stream: {stream})",
            t0.elapsed()
        );
    }
    // And the server still answers as before.
    let (t, _, _) = completion(
        &srv,
        json!({"prompt": PROMPTS[3], "max_tokens": 12, "temperature": 0, "ignore_eos": true}),
    );
    assert_eq!(t, solo[3]);
}

#[test]
fn serve_rejects_hostile_requests() {
    let srv = Server::start(&[
        "--parallel",
        "1",
        "--queue",
        "1",
        "--api-key",
        "sekret",
        "--max-body",
        "4096",
        "--ctx",
        "64",
        "--grace",
        "30",
    ]);
    let auth = [
        ("Authorization", "Bearer sekret"),
        ("Content-Type", "application/json"),
    ];
    let post = |path: &str, body: &[u8]| srv.raw("POST", path, &auth, body);
    // The key.
    let ok = json!({"prompt": "ROMEO:", "max_tokens": 2}).to_string();
    srv.raw("POST", "/v1/completions", &[], ok.as_bytes())
        .error(401);
    srv.raw(
        "POST",
        "/v1/completions",
        &[("Authorization", "Bearer sekre")],
        ok.as_bytes(),
    )
    .error(401);
    srv.raw(
        "GET",
        "/v1/models",
        &[("Authorization", "Basic sekret")],
        b"",
    )
    .error(401);
    assert_eq!(post("/v1/completions", ok.as_bytes()).status, 200);
    assert_eq!(srv.get("/health").status, 200, "health needs no key");
    // Bodies.
    let m = post("/v1/chat/completions", b"{\"messages\": [").error(400);
    assert!(m.contains("not valid JSON"), "{m}");
    post("/v1/chat/completions", b"").error(400);
    post("/v1/chat/completions", b"[]").error(400);
    post("/v1/chat/completions", &[0xff, 0xfe, 0x00]).error(400);
    let big = format!("{{\"prompt\": \"{}\"}}", "a".repeat(10_000));
    let m = post("/v1/completions", big.as_bytes()).error(413);
    assert!(m.contains("too large"), "{m}");
    // Types and values, each error naming its field.
    let user = json!([{"role": "user", "content": "hi"}]);
    for (body, param) in [
        (json!({"messages": "hi"}), "messages"),
        (json!({"messages": []}), "messages"),
        (json!({}), "messages"),
        (
            json!({"messages": [{"role": "user"}]}),
            "messages[0].content",
        ),
        (
            json!({"messages": [{"role": 5, "content": "x"}]}),
            "messages[0].role",
        ),
        (json!({"messages": [{"content": "x"}]}), "messages[0].role"),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            "messages[0].content[0]",
        ),
        (
            json!({"messages": user, "temperature": "hot"}),
            "temperature",
        ),
        (json!({"messages": user, "temperature": 7}), "temperature"),
        (json!({"messages": user, "top_p": 0}), "top_p"),
        (json!({"messages": user, "max_tokens": -3}), "max_tokens"),
        (json!({"messages": user, "max_tokens": 1.5}), "max_tokens"),
        (json!({"messages": user, "max_tokens": 1e300}), "max_tokens"),
        (json!({"messages": user, "n": 3}), "n"),
        (json!({"messages": user, "stop": 5}), "stop"),
        (json!({"messages": user, "stop": ["a", 1]}), "stop"),
        (json!({"messages": user, "stream": "yes"}), "stream"),
        (json!({"messages": user, "seed": "x"}), "seed"),
        (json!({"messages": user, "logprobs": true}), "logprobs"),
        (json!({"messages": user, "tools": {"a": 1}}), "tools"),
        (
            json!({"messages": user, "tools": [{"type": "function"}]}),
            "tools[0]",
        ),
    ] {
        let r = post("/v1/chat/completions", body.to_string().as_bytes());
        r.error(400);
        assert_eq!(r.json()["error"]["param"], param, "{body} -> {}", r.text());
    }
    for body in [
        json!({"prompt": 5}),
        json!({"prompt": ["a", "b"]}),
        json!({"prompt": [1, -2]}),
        json!({"prompt": [99999999]}),
        json!({"prompt": "x", "suffix": "y"}),
    ] {
        post("/v1/completions", body.to_string().as_bytes()).error(400);
    }
    // An unknown model, an unknown route, a wrong method.
    let m = post(
        "/v1/chat/completions",
        json!({"model": "gpt-4o", "messages": user})
            .to_string()
            .as_bytes(),
    )
    .error(404);
    assert!(m.contains("gpt-4o"), "{m}");
    srv.raw("GET", "/v1/nothing", &auth, b"").error(404);
    srv.raw("GET", "/v1/chat/completions", &auth, b"")
        .error(405);
    // A prompt longer than the context (64 tokens).
    let long = json!({"prompt": "word ".repeat(200)}).to_string();
    let r = post("/v1/completions", long.as_bytes());
    r.error(400);
    assert_eq!(r.json()["error"]["code"], "context_length_exceeded");
    assert_eq!(r.json()["error"]["param"], "prompt");
    // max_tokens past the context: generation ends with the context, as `length`.
    let r = post(
        "/v1/completions",
        json!({"prompt": "ROMEO:", "max_tokens": 100000, "temperature": 0, "ignore_eos": true})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["total_tokens"], 64, "{v}");
}

/// The queue limit (429) and shutdown, on a server of one slot and one waiting place.
#[test]
fn serve_queue_limit_and_shutdown() {
    let srv = Server::start(&["--parallel", "1", "--queue", "1", "--grace", "30"]);
    let post = |path: &str, body: &[u8]| srv.raw("POST", path, &[], body);
    let ok = json!({"prompt": "ROMEO:", "max_tokens": 2}).to_string();
    // The queue: one slot, one waiting place; a third request is refused with 429.
    // Long enough to be running and waiting while the third comes (they are cancelled).
    let slow = json!({"prompt": "ROMEO:", "max_tokens": 800, "temperature": 0, "ignore_eos": true,
                      "stream": true})
    .to_string();
    let short = json!({"prompt": "ROMEO:", "max_tokens": 24, "temperature": 0, "ignore_eos": true,
                       "stream": true})
    .to_string();
    let open = |body: &str| {
        let mut s = TcpStream::connect(&srv.addr).unwrap();
        write!(
            s,
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        s
    };
    let first = open(&slow);
    let t0 = Instant::now();
    while srv.health()["slots_busy"] != 1 {
        assert!(t0.elapsed() < Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(10));
    }
    let second = open(&slow);
    while srv.health()["queued"] != 1 {
        assert!(t0.elapsed() < Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(10));
    }
    post("/v1/completions", ok.as_bytes()).error(429);
    drop(first);
    drop(second);
    srv.wait_idle();
    assert_eq!(post("/v1/completions", ok.as_bytes()).status, 200);
    // The engine counts that request's slot as busy until its next loop turn, after the
    // reply went out: wait for it, so that "busy" below is the stream's slot.
    srv.wait_idle();

    // Shutdown: SIGTERM while a stream runs; it finishes, new requests are refused, and the
    // server exits by itself.
    #[cfg(unix)]
    {
        let mut s = open(&short);
        let t0 = Instant::now();
        while srv.health()["slots_busy"] != 1 {
            assert!(t0.elapsed() < Duration::from_secs(30));
            std::thread::sleep(Duration::from_millis(10));
        }
        let pid = srv.child.id().to_string();
        let killed = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        assert!(killed.success());
        let mut bytes = Vec::new();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s.read_to_end(&mut bytes).unwrap();
        let st = streamed(&Reply::parse(&bytes));
        assert_eq!(st.finish, "length", "the running stream finished");
        let mut srv = srv;
        let t0 = Instant::now();
        let status = loop {
            if let Some(s) = srv.child.try_wait().unwrap() {
                break s;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "still running 30 s after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(status.success(), "{status}");
        let log: Vec<String> = srv.log.try_iter().collect();
        assert!(log.iter().any(|l| l.contains("shutting down")), "{log:?}");
    }
}

/// The official `openai` Python package against the server (tests/serve_openai.py). dev.sh
/// installs it into target/pyenv-openai and passes it as SPARSA_OPENAI_PYTHON; elsewhere the
/// test is skipped with a note, except under CI, where a missing client fails it.
#[test]
fn serve_openai_python_client() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = std::env::var_os("SPARSA_OPENAI_PYTHON")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| root.join("target/pyenv-openai/bin/python"));
    let works = std::process::Command::new(&python)
        .args(["-c", "import openai"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !works {
        let ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false");
        assert!(
            !ci,
            "{}: no Python with the openai package (./dev.sh test installs it)",
            python.display()
        );
        eprintln!(
            "skipped: {} has no openai package (./dev.sh test serve installs it)",
            python.display()
        );
        return;
    }
    let srv = Server::start(&["--parallel", "2", "--api-key", "test-key"]);
    let out = common::run_with_timeout(
        {
            let mut c = std::process::Command::new(&python);
            c.arg(root.join("tests/serve_openai.py"))
                .arg(format!("{}/v1", srv.url()))
                .arg("test-key");
            c
        },
        None,
    );
    assert!(
        out.status.success(),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("openai client: all checks passed"),
        "{stdout}"
    );
}

/// The built-in model behind a template that opens `<think>` for the reply and reads `tools`
/// and tool calls GLM-style: the reply comes back as `reasoning_content` (streamed as
/// `delta.reasoning_content`), and tools and earlier tool calls reach the prompt.
#[test]
fn serve_reasoning_and_tools_reach_the_template() {
    let dir = common::tmpdir("serve-think");
    for f in [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        std::fs::copy(common::builtin_dir().join(f), dir.join(f)).unwrap();
    }
    std::fs::write(
        dir.join("chat_template.jinja"),
        "[gMASK]<sop>{% if tools %}<|system|>\n{% for t in tools %}{{ t | tojson }}{% endfor %}{% endif %}\
         {% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}\
         {% for tc in m.tool_calls or [] %}<tool_call>{{ tc.function.name }}\
         {% for k, v in tc.function.arguments.items() %}<arg_key>{{ k }}</arg_key><arg_value>{{ v }}</arg_value>{% endfor %}</tool_call>{% endfor %}\
         {% endfor %}{% if add_generation_prompt %}<|assistant|>\n<think>{% endif %}",
    )
    .unwrap();
    let srv = Server::start(&["--model", dir.to_str().unwrap(), "--parallel", "1"]);
    let models = srv.get("/v1/models").json();
    assert_eq!(
        models["data"][0]["id"].as_str(),
        dir.file_name().unwrap().to_str(),
        "the model id is the directory's name"
    );
    let model = models["data"][0]["id"].as_str().unwrap().to_string();
    let base = json!({"model": model, "temperature": 0, "max_tokens": 8, "ignore_eos": true,
                      "messages": [{"role": "user", "content": "Who art thou?"}]});
    let r = srv.post("/v1/chat/completions", &base);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let m = &v["choices"][0]["message"];
    let reasoning = m["reasoning_content"].as_str().expect("reasoning_content");
    assert!(!reasoning.is_empty(), "{v}");
    let mut sb = base.clone();
    sb["stream"] = json!(true);
    let s = streamed(&srv.post("/v1/chat/completions", &sb));
    assert_eq!(s.reasoning.trim(), reasoning);
    assert_eq!(s.text.trim(), m["content"].as_str().unwrap());
    // Tools and an earlier tool call lengthen the prompt by what the template prints.
    let plain = v["usage"]["prompt_tokens"].as_u64().unwrap();
    let mut tb = base.clone();
    tb["tools"] = json!([{"type": "function", "function": {"name": "get_weather",
                          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let with_tools = srv.post("/v1/chat/completions", &tb).json()["usage"]["prompt_tokens"]
        .as_u64()
        .unwrap();
    assert!(with_tools > plain + 10, "{with_tools} vs {plain}");
    tb["tool_choice"] = json!("none");
    let none = srv.post("/v1/chat/completions", &tb).json()["usage"]["prompt_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(none, plain, "tool_choice none leaves the tools out");
    let mut cb = base.clone();
    cb["messages"] = json!([
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Verona\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "fair"},
    ]);
    let tokens = |body: &Value| {
        let r = srv.post("/v1/chat/completions", body);
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["usage"]["prompt_tokens"].as_u64().unwrap()
    };
    let with_call = tokens(&cb);
    cb["messages"][1]["tool_calls"] = json!([]);
    let without = tokens(&cb);
    assert!(
        with_call > without + 5,
        "the tool call (name, argument) is printed: {with_call} vs {without}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `serve --draft 3`: every slot decodes in speculative rounds with the built-in model's MTP
/// layer. Greedy replies equal a server's without drafts, whether the requests run alone or
/// side by side in two slots, after a prefix the slot already holds, and with a stop string;
/// a sampled request completes with its token count.
#[test]
fn serve_drafts_keep_greedy_replies() {
    let plain = Server::start(&["--parallel", "1"]);
    let drafted = Server::start(&["--parallel", "2", "--draft", "3"]);
    let body =
        |p: &str| json!({"prompt": p, "max_tokens": 24, "temperature": 0, "ignore_eos": true});
    let want: Vec<String> = PROMPTS
        .iter()
        .map(|p| completion(&plain, body(p)).0)
        .collect();
    // Alone, one after another (the second and later reuse what the slot holds).
    for (p, w) in PROMPTS.iter().zip(&want) {
        let (text, finish, usage) = completion(&drafted, body(p));
        assert_eq!(&text, w, "{p:?} alone");
        assert_eq!(finish, "length");
        assert_eq!(usage["completion_tokens"], 24, "{usage}");
    }
    // Side by side: two slots' rounds interleave.
    std::thread::scope(|sc| {
        let handles: Vec<_> = PROMPTS
            .iter()
            .map(|p| {
                let (addr, body) = (&drafted.addr, body(p));
                sc.spawn(move || completion_at(addr, body).0)
            })
            .collect();
        for ((h, w), p) in handles.into_iter().zip(&want).zip(PROMPTS) {
            assert_eq!(&h.join().unwrap(), w, "{p:?} side by side");
        }
    });
    // A stop string inside the reply: the text ends before it, as without drafts.
    let cut = &want[3][want[3].len() / 2..];
    let stop: String = cut.chars().take(3).collect();
    let with_stop = |srv: &Server| {
        let mut b = body(PROMPTS[3]);
        b["stop"] = json!([stop]);
        completion(srv, b)
    };
    let (a, fa, _) = with_stop(&plain);
    let (b, fb, _) = with_stop(&drafted);
    assert_eq!((a, fa), (b, fb), "stop {stop:?}");
    // Sampled: speculative sampling's rule, the whole token budget.
    let (_, finish, usage) = completion(
        &drafted,
        json!({"prompt": PROMPTS[1], "max_tokens": 16, "temperature": 0.9, "seed": 5, "ignore_eos": true}),
    );
    assert_eq!(finish, "length");
    assert_eq!(usage["completion_tokens"], 16, "{usage}");
    drafted.wait_idle();
    // /health counts the rounds; the built-in model's layer drafts well on its own text.
    let d = &drafted.health()["drafts"];
    assert!(d["rounds"].as_u64().unwrap() > 20, "{d}");
    assert!(d["tokens_per_verification"].as_f64().unwrap() > 1.5, "{d}");
    assert!(plain.health().get("drafts").is_none());
}
