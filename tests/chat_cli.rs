//! `sparsa chat` end to end with the built-in model: driven through a pseudo-terminal (line
//! editing, Ctrl-C, commands) and with piped stdin. Greedy decoding and short replies keep it
//! fast on lavapipe.
#![cfg(unix)]

use rexpect::session::{spawn_with_options, Options, PtySession};
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// Generous: the first expectation includes loading the model and compiling its shaders.
const TIMEOUT_MS: u64 = 60_000;

fn tmpfile(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("sparsa-chat-test-{}-{name}", std::process::id()))
}

fn chat(args: &[&str]) -> PtySession {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sparsa"));
    c.args(["chat", "--temperature", "0"]).args(args);
    c.env("TERM", "xterm").env_remove("NO_COLOR");
    let opts = Options::new()
        .timeout_ms(Some(TIMEOUT_MS))
        .strip_ansi_escape_codes(true);
    spawn_with_options(c, opts).expect("spawn sparsa chat in a pty")
}

/// Waits for the prompt at the start of a line; returns what came before it (the reply).
fn prompt(p: &mut PtySession) -> String {
    // rustyline starts its prompt with a carriage return; a redrawn input line also does, but
    // only a new prompt follows a newline.
    p.exp_regex(r"\n\r?>>> ").expect("the prompt comes back").0
}

/// Sends a message and waits for its reply to start streaming: the echo of the line, the
/// newline after it, then a few characters of the reply.
fn send_and_wait_for_text(p: &mut PtySession, line: &str) {
    p.send_line(line).unwrap();
    p.exp_string(line).unwrap();
    p.exp_string("\n").unwrap();
    p.exp_regex(r"\S\S\S").expect("the reply streams");
}

#[derive(Debug, Clone, Copy)]
struct Stats {
    prompt: usize,
    prefilled: usize,
    reused: usize,
    /// Tokens in the caches after the reply.
    context: usize,
}

fn numbers(s: &str) -> Vec<usize> {
    s.split(|c: char| !c.is_ascii_digit())
        .filter(|x| !x.is_empty())
        .map(|x| x.parse().unwrap())
        .collect()
}

/// `/stats`, parsed.
fn stats(p: &mut PtySession) -> Stats {
    p.send_line("/stats").unwrap();
    let (_, m) = p
        .exp_regex(r"prompt \d+ tokens: \d+ prefilled, \d+ reused")
        .expect("/stats shows the last turn");
    let n = numbers(&m);
    let (_, c) = p
        .exp_regex(r"context \d+/\d+ tokens in use")
        .expect("/stats shows the context");
    let c = numbers(&c);
    prompt(p);
    Stats {
        prompt: n[0],
        prefilled: n[1],
        reused: n[2],
        context: c[0],
    }
}

fn saved(p: &mut PtySession, name: &str, count: usize) -> serde_json::Value {
    let file = tmpfile(name);
    p.send_line(&format!("/save {}", file.display())).unwrap();
    p.exp_string(&format!("saved {count} messages"))
        .expect("/save reports the messages");
    prompt(p);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let _ = std::fs::remove_file(&file);
    v
}

fn leave(mut p: PtySession) {
    p.send_line("/exit").unwrap();
    p.exp_eof().expect("/exit leaves");
    match p.process().wait() {
        Ok(rexpect::process::WaitStatus::Exited(_, 0)) => {}
        other => panic!("sparsa chat did not exit cleanly: {other:?}"),
    }
}

#[test]
fn two_turns_reuse_the_cache_then_reset() {
    let mut p = chat(&["--max-tokens", "6"]);
    let start = prompt(&mut p);
    // The caches are f32 where they fit, and grow as the context fills: nothing yet.
    assert!(
        start.contains("ctx 1024 (the built-in model's training length)")
            && start.contains("caches f32/f32 (3.1 KB/token): 0.0 MB now, 3.1 MB at 1024 tokens"),
        "start line: {start}"
    );
    p.send_line("Good morrow, sir.").unwrap();
    prompt(&mut p);
    let s1 = stats(&mut p);
    assert_eq!(s1.reused, 0, "{s1:?}");
    assert_eq!(s1.prefilled, s1.prompt, "{s1:?}");
    assert!(s1.context > s1.prompt, "the reply is in the cache: {s1:?}");

    p.send_line("What news from the court?").unwrap();
    prompt(&mut p);
    let s2 = stats(&mut p);
    // Everything the caches held after turn 1 (its prompt and reply) is reused; only the
    // tokens added since (the end of the reply, the new message, the generation prompt) run.
    assert_eq!(s2.reused, s1.context, "turn 2 {s2:?} after turn 1 {s1:?}");
    assert_eq!(s2.prefilled, s2.prompt - s1.context, "{s2:?}");
    assert!(s2.prefilled < s2.prompt, "{s2:?}");

    let v = saved(&mut p, "two-turns.json", 4);
    let roles: Vec<&str> = v["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["user", "assistant", "user", "assistant"]);
    assert_eq!(v["messages"][2]["content"], "What news from the court?");

    p.send_line("/reset").unwrap();
    p.exp_string("conversation cleared").unwrap();
    prompt(&mut p);
    p.send_line("Good morrow, sir.").unwrap();
    prompt(&mut p);
    let s3 = stats(&mut p);
    // The same one-message conversation as turn 1; its tokens are still at the start of the
    // caches, so only the last one is run again (to get the logits of the next token).
    assert_eq!(s3.prompt, s1.prompt, "{s3:?}");
    assert_eq!(s3.prefilled, 1, "{s3:?}");
    saved(&mut p, "after-reset.json", 2);
    leave(p);
}

#[test]
fn ctrl_c_stops_the_reply_and_keeps_it() {
    let mut p = chat(&["--max-tokens", "500", "--ignore-eos"]);
    prompt(&mut p);
    send_and_wait_for_text(&mut p, "Speak, I charge thee.");
    p.send_control('c').unwrap();
    p.exp_string("interrupted; the reply so far is kept")
        .expect("Ctrl-C stops the reply");
    prompt(&mut p);
    let s1 = stats(&mut p);
    assert!(s1.context < s1.prompt + 400, "stopped early: {s1:?}");
    let v = saved(&mut p, "interrupted.json", 2);
    let reply = v["messages"][1]["content"].as_str().unwrap().to_string();
    assert_eq!(v["messages"][1]["role"], "assistant");
    assert!(reply.len() >= 3, "the partial reply is kept: {reply:?}");

    // The next turn streams again and reuses the interrupted turn's cache.
    send_and_wait_for_text(&mut p, "Farewell.");
    p.send_control('c').unwrap();
    p.exp_string("interrupted; the reply so far is kept")
        .unwrap();
    prompt(&mut p);
    let s2 = stats(&mut p);
    assert!(s2.reused >= s1.prompt, "turn 2 {s2:?} after turn 1 {s1:?}");
    assert_eq!(s2.prefilled, s2.prompt - s2.reused);

    // Ctrl-C at the prompt clears the line; Ctrl-D leaves.
    p.send("half a line").unwrap();
    p.flush().unwrap();
    p.send_control('c').unwrap();
    prompt(&mut p);
    p.send_line("/stats").unwrap();
    p.exp_string("2 turns in the conversation")
        .expect("the cleared line was not sent");
    prompt(&mut p);
    p.send_control('d').unwrap();
    p.exp_eof().expect("Ctrl-D leaves");
}

#[test]
fn context_overflow_drops_old_turns_and_refuses_what_cannot_fit() {
    // 20 positions, replies of up to 16 tokens: 5 (a quarter of the context) are kept for the
    // reply when fitting a turn, so a reply can run into the end of the context.
    let mut p = chat(&["--ctx", "20", "--max-tokens", "16", "--ignore-eos"]);
    let start = prompt(&mut p);
    assert!(start.contains("ctx 20 (--ctx)"), "start line: {start}");
    p.send_line("Good morrow.").unwrap();
    p.exp_string("the reply reached the end of the context (--ctx 20)")
        .expect("decoding stops at the end of the context");
    prompt(&mut p);
    let s1 = stats(&mut p);
    assert_eq!(s1.context, 20, "the caches are full: {s1:?}");

    p.send_line("What news?").unwrap();
    p.exp_string("context full: dropped the oldest 1 turn to fit --ctx 20")
        .expect("the first turn is dropped");
    prompt(&mut p);
    let v = saved(&mut p, "overflow.json", 2);
    assert_eq!(v["messages"][0]["content"], "What news?");

    let long = "word ".repeat(40);
    p.send_line(long.trim()).unwrap();
    p.exp_string("message too long")
        .expect("a message that cannot fit is refused");
    prompt(&mut p);
    saved(&mut p, "refused.json", 2);
    leave(p);
}

#[test]
fn piped_stdin_gets_one_plain_reply_per_line() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sparsa"))
        .args([
            "chat",
            "--temperature",
            "0",
            "--max-tokens",
            "8",
            "--stop",
            r"\n",
            "--think",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(b"Good morrow, sir.\n\nWhat news from the court?\n")
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "stderr: {stderr}");
    assert!(!stdout.contains('\x1b'), "no ANSI codes: {stdout:?}");
    assert!(!stdout.contains(">>>"), "no prompt: {stdout:?}");
    assert_eq!(
        stdout.lines().count(),
        2,
        "one reply per non-empty line: {stdout:?}"
    );
    assert!(
        stderr.contains("--think: the chat template has no thinking switch"),
        "{stderr}"
    );
    assert!(
        stderr.contains("template: tokenizer_config.json"),
        "{stderr}"
    );
}

/// The built-in model with a template whose generation prompt opens `<think>` when
/// `enable_thinking` is set: the reply starts as reasoning.
fn thinking_model() -> PathBuf {
    let dir = tmpfile("thinking-model");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let bard = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/sparsa-bard-12m");
    for f in [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        std::os::unix::fs::symlink(bard.join(f), dir.join(f)).unwrap();
    }
    std::fs::write(
        dir.join("chat_template.jinja"),
        "[gMASK]<sop>{%- for m in messages -%}{{ '<|' + m.role + '|>\\n' + m.content }}{%- endfor -%}\
         {%- if add_generation_prompt -%}{{ '<|assistant|>\\n' }}\
         {%- if enable_thinking is defined and enable_thinking %}<think>{% endif -%}{%- endif -%}",
    )
    .unwrap();
    dir
}

#[test]
fn thinking_is_passed_to_the_template_shown_in_tags_and_saved() {
    let dir = thinking_model();
    let save = tmpfile("thinking.json");
    let out = Command::new(env!("CARGO_BIN_EXE_sparsa"))
        .args([
            "chat",
            "--temperature",
            "0",
            "--max-tokens",
            "4",
            "--think",
            "--model",
        ])
        .arg(&dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            let mut stdin = child.stdin.take().unwrap();
            writeln!(stdin, "Good morrow.\n/save {}", save.display())?;
            drop(stdin);
            child.wait_with_output()
        })
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "stderr: {stderr}");
    assert!(stderr.contains("template: chat_template.jinja"), "{stderr}");
    assert!(!stderr.contains("no thinking switch"), "{stderr}");
    // No colour on a pipe: the reasoning is printed between literal tags.
    let line = stdout.trim_end_matches('\n');
    assert!(
        line.starts_with("<think>") && line.ends_with("</think>") && line.len() > 15,
        "{stdout:?}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&save).unwrap()).unwrap();
    let reply = &v["messages"][1];
    assert_eq!(reply["role"], "assistant");
    assert_eq!(reply["content"], "");
    let printed = line
        .strip_prefix("<think>")
        .and_then(|l| l.strip_suffix("</think>"))
        .unwrap();
    assert_eq!(
        reply["reasoning_content"].as_str().unwrap(),
        printed.trim(),
        "the printed reasoning is the stored one"
    );
    let _ = std::fs::remove_file(&save);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--json` with piped stdin: exactly one JSON line per message, a refused one included, so a
/// script can pair each reply with its message.
#[test]
fn json_gives_one_line_per_message() {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sparsa"));
    c.args([
        "chat",
        "--json",
        "--temperature",
        "0",
        "-n",
        "6",
        "--ctx",
        "64",
    ]);
    let long = "word ".repeat(80);
    let input = format!("Good morrow, sir.\n{long}\nWhat news?\n");
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(1), "a message was refused");
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    for i in [0, 2] {
        let r = &lines[i];
        assert!(r["content"].is_string(), "{r}");
        assert!(
            ["stop", "length"].contains(&r["finish_reason"].as_str().unwrap()),
            "{r}"
        );
        assert!(
            r["usage"]["completion_tokens"].as_u64().unwrap() >= 1,
            "{r}"
        );
    }
    assert!(
        lines[1]["error"]
            .as_str()
            .unwrap()
            .contains("message too long"),
        "{}",
        lines[1]
    );
}

/// `sparsa chat` with stdin piped and `env`; its stderr (the status line) and stdout.
fn piped_chat(args: &[&str], env: &[(&str, &str)], input: &[u8]) -> (bool, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sparsa"));
    c.args(["chat", "--temperature", "0", "--max-tokens", "4"])
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    {
        use std::io::Write;
        child.stdin.take().unwrap().write_all(input).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stderr).unwrap(),
        String::from_utf8(out.stdout).unwrap(),
    )
}

/// With little GPU memory the default context is the longest whose caches fit after the
/// weights, said on the status line with the compact format chosen for it; `sparsa info`
/// prints the same context; --cache-type is honoured and named.
#[test]
fn the_default_context_is_what_the_memory_holds_and_the_status_line_says_so() {
    // The built-in model's weights take about 14 MB on the GPU and its scratch about 10 MB:
    // 30.5 MB (85 % of it usable) leave room for a few hundred positions of the smallest
    // caches.
    let env = [("SPARSA_FAULT_GPU_MEMORY", "30500000")];
    let (ok, err, out) = piped_chat(&[], &env, b"Good morrow.\n");
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 1, "{out}");
    let status = err.lines().find(|l| l.contains("| ctx ")).expect(&err);
    let ctx = status
        .split("| ctx ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse::<usize>().ok())
        .expect(status);
    assert!(ctx > 0 && ctx < 1024, "{status}");
    assert!(
        status.contains(&format!(
            "ctx {ctx} (the longest whose fp8/i8 caches fit the adapter's"
        )) && status.contains("the built-in model's training length 1024 does not)")
            && status.contains("caches fp8/i8 (0.9 KB/token): 0.0 MB now"),
        "{status}"
    );
    let mut c = Command::new(env!("CARGO_BIN_EXE_sparsa"));
    c.arg("info").envs(env.iter().copied());
    let info = String::from_utf8(c.output().unwrap().stdout).unwrap();
    assert!(
        info.contains(&format!("chat's default context (without --ctx): {ctx} (")),
        "{info}"
    );

    // --cache-type bf16 sizes the default context in bf16 caches.
    let (ok, err, _) = piped_chat(&["--cache-type", "bf16"], &env, b"Good morrow.\n");
    assert!(ok, "{err}");
    let status = err.lines().find(|l| l.contains("| ctx ")).expect(&err);
    assert!(
        status.contains("the longest whose bf16/bf16 caches fit")
            && status.contains("caches bf16/bf16 (1.5 KB/token)"),
        "{status}"
    );
}
