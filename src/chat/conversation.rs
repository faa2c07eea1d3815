//! A multi-turn conversation held against one [`Session`], reusing its caches between turns.
//!
//! Each turn, [`Chat::prepare`] renders the whole conversation with the chat template (with the
//! generation prompt) and tokenizes it; [`Chat::reply`] keeps the longest prefix that the
//! session's caches already hold (the KV and indexer caches of earlier turns), rolls the session
//! back to it and prefills only the rest. When a template rewrites earlier turns (GLM drops old
//! reasoning, for example) the common prefix is shorter and more is prefilled: the result is
//! always what a fresh prefill of the rendered prompt would compute.
//!
//! **Context policy.** Before a turn, the prompt plus room for the reply ([`reply_reserve`]:
//! `max_tokens`, at most a quarter of the context) must fit in the context. If it does not, the
//! oldest turns (a user message and everything up to the next user message) are dropped, oldest
//! first, until the prompt and the reply's room take at most half the context (or only the
//! newest turn is left), so the caches serve several turns before the next drop refills them;
//! the system prompt is always kept. If the newest message still does not fit on its own,
//! it is refused ([`Prepared::TooLong`]) and the conversation is left as it was. During the
//! reply, generation stops when the context is full ([`ReplyEnd::ContextFull`]).
//!
//! **Tokenization.** A rendered template already contains its special tokens, so it is encoded
//! with [`Tokenizer::encode_raw`]. The plain fallback ([`ChatTemplate::plain`]) has none, so it
//! is encoded with [`Tokenizer::encode`], which adds the tokenizer's own prefix (its BOS).
//!
//! **Reasoning.** Text between `<think>` and `</think>` (or from the start of the reply, when the
//! prompt itself ends with `<think>`) is reasoning: it is reported as [`Part::Reasoning`] and
//! stored in the assistant message's `reasoning_content`; the rest is the `content`.

use super::{ChatTemplate, Message};
use crate::error::{Error, Result};
use crate::generate::{generate_events_async, partial_suffix, Event, Sampler, Stop, StopStrings};
use crate::model::Session;
use crate::tokenizer::{TextStream, Tokenizer};
use serde::{Deserialize, Serialize};

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";

/// The messages of a conversation, in the shape transformers' `apply_chat_template` takes
/// (an optional `system` message first). Saved and loaded as `{"messages": [...]}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Conversation {
    pub messages: Vec<Message>,
}

impl Conversation {
    pub fn new(system: Option<String>) -> Conversation {
        let mut c = Conversation::default();
        c.set_system(system);
        c
    }

    /// The system prompt: the first message, if its role is `system`.
    pub fn system(&self) -> Option<&str> {
        match self.messages.first() {
            Some(m) if m.role == "system" => Some(&m.content),
            _ => None,
        }
    }

    /// Sets (or, with `None` or an empty text, removes) the system prompt.
    pub fn set_system(&mut self, text: Option<String>) {
        if self.system().is_some() {
            self.messages.remove(0);
        }
        if let Some(t) = text.filter(|t| !t.is_empty()) {
            self.messages.insert(0, Message::new("system", t));
        }
    }

    /// Forgets every message but the system prompt.
    pub fn clear(&mut self) {
        let keep = usize::from(self.system().is_some());
        self.messages.truncate(keep);
    }

    /// Number of user messages.
    pub fn turns(&self) -> usize {
        self.messages.iter().filter(|m| m.role == "user").count()
    }

    /// Drops the oldest turn: the first message after the system prompt and everything up to
    /// the next user message. Returns false (and changes nothing) when no later user message
    /// exists, so the newest turn is never dropped.
    pub fn drop_oldest_turn(&mut self) -> bool {
        let first = usize::from(self.system().is_some());
        if first >= self.messages.len() {
            return false;
        }
        let next_user = self.messages[first + 1..]
            .iter()
            .position(|m| m.role == "user")
            .map(|i| first + 1 + i);
        match next_user {
            Some(end) => {
                self.messages.drain(first..end);
                true
            }
            None => false,
        }
    }

    /// `{"messages": [...]}`, pretty-printed.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|_| "{\"messages\": []}".to_string())
    }

    /// A conversation saved by [`Conversation::to_json`], or a bare list of messages
    /// (`[{"role": "user", "content": "..."}, ...]`).
    pub fn from_json(text: &str) -> Result<Conversation> {
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| Error::msg(format!("not valid JSON: {e}")))?;
        let list = match &v {
            serde_json::Value::Array(a) => a,
            serde_json::Value::Object(o) => match o.get("messages") {
                Some(serde_json::Value::Array(a)) => a,
                _ => {
                    return Err(Error::msg(
                        "expected {\"messages\": [...]} or a list of messages",
                    ))
                }
            },
            _ => {
                return Err(Error::msg(
                    "expected {\"messages\": [...]} or a list of messages",
                ))
            }
        };
        let messages = list
            .iter()
            .enumerate()
            .map(|(i, m)| {
                serde_json::from_value::<Message>(m.clone()).map_err(|e| {
                    Error::msg(format!(
                        "message {}: {e} (each message needs a string \"role\" and \"content\")",
                        i + 1
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Conversation { messages })
    }
}

/// The chat template and the keyword arguments it is rendered with.
#[derive(Debug, Clone)]
pub struct ChatFormat {
    template: ChatTemplate,
    plain: bool,
    extra: serde_json::Map<String, serde_json::Value>,
}

impl ChatFormat {
    /// The model's template, or the plain fallback when it has none.
    pub fn new(template: Option<ChatTemplate>) -> ChatFormat {
        let plain = template.is_none();
        ChatFormat {
            template: template.unwrap_or_else(ChatTemplate::plain),
            plain,
            extra: serde_json::Map::new(),
        }
    }

    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    /// Whether this is the plain fallback (the model has no template).
    pub fn is_plain(&self) -> bool {
        self.plain
    }

    /// Turns thinking on or off through `enable_thinking` (GLM, Qwen) and `thinking`
    /// (DeepSeek V3.1/V3.2). Returns false, changing nothing, when the template reads neither.
    pub fn set_thinking(&mut self, on: bool) -> bool {
        if !self.template.supports_thinking() {
            return false;
        }
        self.extra
            .insert("enable_thinking".into(), serde_json::Value::Bool(on));
        self.extra
            .insert("thinking".into(), serde_json::Value::Bool(on));
        true
    }

    /// The conversation as the model reads it, ending with the generation prompt.
    pub fn render(&self, conv: &Conversation) -> Result<String> {
        self.template.render(&conv.messages, true, &self.extra)
    }

    /// Messages given as JSON objects (OpenAI's shape, with `tool_calls` and the like)
    /// rendered with the generation prompt; `extra` adds to (and overrides) the format's own
    /// keyword arguments, e.g. `tools`.
    pub fn render_json(
        &self,
        messages: &[serde_json::Value],
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        let mut all = self.extra.clone();
        all.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
        self.template.render_json(messages, true, &all)
    }

    /// Token ids of a rendered conversation (see the module docs for which encoding).
    pub fn encode(&self, tok: &Tokenizer, text: &str) -> Result<Vec<u32>> {
        if self.plain {
            tok.encode(text)
        } else {
            tok.encode_raw(text)
        }
    }
}

/// Room kept for the reply when fitting a conversation into `ctx` tokens: `max_tokens`, at
/// most a quarter of the context, at least one token.
pub fn reply_reserve(max_tokens: usize, ctx: usize) -> usize {
    max_tokens.min(ctx / 4).max(1)
}

/// Which part of a reply a piece of text belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Reasoning,
    Content,
}

/// Splits a reply as it streams: cuts it at the first stop string and separates reasoning
/// (`<think>` … `</think>`) from content, holding back text that may be the start of a tag or
/// of a stop string.
#[derive(Debug, Clone)]
pub struct ReplyText {
    stops: StopStrings,
    in_reasoning: bool,
    saw_reasoning: bool,
    held: String,
    reasoning: String,
    content: String,
}

impl ReplyText {
    /// `starts_in_reasoning`: the prompt ended with `<think>`, so the reply opens inside it.
    pub fn new(stops: Vec<String>, starts_in_reasoning: bool) -> ReplyText {
        ReplyText {
            stops: StopStrings::new(stops),
            in_reasoning: starts_in_reasoning,
            saw_reasoning: starts_in_reasoning,
            held: String::new(),
            reasoning: String::new(),
            content: String::new(),
        }
    }

    /// Whether a stop string ended the reply.
    pub fn stopped(&self) -> bool {
        self.stops.hit()
    }

    /// Feeds decoded text; returns the pieces now safe to show, in order.
    pub fn push(&mut self, text: &str) -> Vec<(Part, String)> {
        let safe = self.stops.push(text);
        self.split(&safe, false)
    }

    /// Everything still held back, once the reply is over.
    pub fn finish(&mut self) -> Vec<(Part, String)> {
        let tail = self.stops.finish();
        self.split(&tail, true)
    }

    fn split(&mut self, text: &str, last: bool) -> Vec<(Part, String)> {
        let mut out = Vec::new();
        let mut buf = std::mem::take(&mut self.held);
        buf.push_str(text);
        loop {
            let tag = if self.in_reasoning {
                THINK_CLOSE
            } else {
                THINK_OPEN
            };
            if let Some(at) = buf.find(tag) {
                self.emit(&buf[..at], &mut out);
                buf.drain(..at + tag.len());
                self.in_reasoning = !self.in_reasoning;
                self.saw_reasoning = true;
                continue;
            }
            let keep = if last {
                0
            } else {
                partial_suffix(&buf, &[tag])
            };
            self.emit(&buf[..buf.len() - keep], &mut out);
            buf.drain(..buf.len() - keep);
            self.held = buf;
            return out;
        }
    }

    fn emit(&mut self, text: &str, out: &mut Vec<(Part, String)>) {
        if text.is_empty() {
            return;
        }
        let part = if self.in_reasoning {
            self.reasoning.push_str(text);
            Part::Reasoning
        } else {
            self.content.push_str(text);
            Part::Content
        };
        out.push((part, text.to_string()));
    }

    /// The reply as an assistant message: the content (and reasoning, if any) with surrounding
    /// whitespace trimmed, as chat templates print them.
    /// Whether the reply has no text (reasoning or content) worth keeping.
    pub fn is_empty(&self) -> bool {
        self.content.trim().is_empty() && self.reasoning.trim().is_empty()
    }

    pub fn message(&self) -> Message {
        let mut m = Message::new("assistant", self.content.trim());
        if self.saw_reasoning {
            m.reasoning_content = Some(self.reasoning.trim().to_string());
        }
        m
    }
}

/// A turn ready to run: the whole rendered conversation as tokens.
#[derive(Debug, Clone)]
pub struct TurnPlan {
    /// The rendered conversation, ending with the generation prompt.
    pub text: String,
    pub prompt: Vec<u32>,
    /// Leading tokens of `prompt` that the session's caches already hold.
    pub reused: usize,
    /// Old turns dropped to make the prompt fit.
    pub dropped_turns: usize,
    /// The prompt ends inside `<think>`.
    pub starts_in_reasoning: bool,
}

/// The outcome of [`Chat::prepare`].
#[derive(Debug, Clone)]
pub enum Prepared {
    Ready(TurnPlan),
    /// The newest message does not fit even alone (with the system prompt): `tokens` prompt
    /// tokens against `room` (the context minus the reply reserve). Nothing was changed.
    TooLong {
        tokens: usize,
        room: usize,
    },
}

/// Why a reply ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyEnd {
    /// An end-of-sequence token.
    Eos,
    /// A stop string.
    StopString,
    MaxTokens,
    /// The context is full.
    ContextFull,
    /// The caller's callback returned false.
    Interrupted,
}

/// What a turn did.
#[derive(Debug, Clone)]
pub struct TurnResult {
    pub end: ReplyEnd,
    /// Tokens of the rendered prompt.
    pub prompt_tokens: usize,
    /// Prompt tokens taken from the caches.
    pub reused: usize,
    /// Prompt tokens run through the model (`prompt_tokens - reused`, fewer if interrupted).
    pub prefilled: usize,
    /// Tokens sampled (an eos token included).
    pub generated: usize,
    /// The stored reply; `None` when the turn was interrupted before any token and the user
    /// message was taken back out of the conversation.
    pub message: Option<Message>,
}

/// What [`Chat::reply`] reports while it runs; the callback returns false to interrupt.
#[derive(Debug, Clone, Copy)]
pub enum ChatEvent<'a> {
    Prefill {
        done: usize,
        total: usize,
    },
    /// A sampled token, before its text.
    Token(u32),
    Text(Part, &'a str),
}

/// Generation settings of a reply.
#[derive(Debug, Clone, Default)]
pub struct ReplyOptions {
    pub max_tokens: usize,
    pub eos: Vec<u32>,
    pub stop: Vec<String>,
}

/// A conversation, its format and the token ids in the session's caches.
#[derive(Debug, Clone)]
pub struct Chat {
    pub conversation: Conversation,
    pub format: ChatFormat,
    cached: Vec<u32>,
}

impl Chat {
    pub fn new(format: ChatFormat, system: Option<String>) -> Chat {
        Chat {
            conversation: Conversation::new(system),
            format,
            cached: Vec::new(),
        }
    }

    /// The token ids the session's caches hold (positions `0 .. len`).
    pub fn cached(&self) -> &[u32] {
        &self.cached
    }

    /// Call after resetting the session outside of [`Chat::reply`].
    pub fn forget_cache(&mut self) {
        self.cached.clear();
    }

    /// The conversation rendered (with the generation prompt) and tokenized.
    pub fn encode(&self, tok: &Tokenizer) -> Result<(String, Vec<u32>)> {
        let text = self.format.render(&self.conversation)?;
        let ids = self.format.encode(tok, &text)?;
        Ok((text, ids))
    }

    /// Adds the user message and fits the conversation into `ctx` tokens with `reserve` left
    /// for the reply, dropping the oldest turns if needed (see the module docs). On
    /// [`Prepared::TooLong`] or an error the conversation is unchanged.
    pub fn prepare(
        &mut self,
        tok: &Tokenizer,
        user: &str,
        ctx: usize,
        reserve: usize,
    ) -> Result<Prepared> {
        let saved = self.conversation.clone();
        self.conversation.messages.push(Message::new("user", user));
        let mut dropped = 0;
        loop {
            let (text, prompt) = match self.encode(tok) {
                Ok(x) => x,
                Err(e) => {
                    self.conversation = saved;
                    return Err(e);
                }
            };
            if prompt.is_empty() {
                self.conversation = saved;
                return Err(Error::msg("the rendered chat prompt has no tokens"));
            }
            let fits = prompt.len() + reserve <= ctx;
            // Once turns must go, enough go to free half the context: the caches hold the
            // new start for several turns instead of being refilled after every reply.
            let roomy = prompt.len() + reserve <= ctx / 2;
            let done = fits && (dropped == 0 || roomy);
            if done || !self.conversation.drop_oldest_turn() {
                if !fits {
                    self.conversation = saved;
                    return Ok(Prepared::TooLong {
                        tokens: prompt.len(),
                        room: ctx.saturating_sub(reserve),
                    });
                }
                let reused = common_prefix(&self.cached, &prompt).min(prompt.len() - 1);
                let starts_in_reasoning = text.trim_end().ends_with(THINK_OPEN);
                return Ok(Prepared::Ready(TurnPlan {
                    text,
                    prompt,
                    reused,
                    dropped_turns: dropped,
                    starts_in_reasoning,
                }));
            }
            dropped += 1;
        }
    }

    /// Runs a prepared turn: rolls the session back to the reused prefix, prefills the rest,
    /// streams the reply through `on_event` and stores it as the assistant message (the reply
    /// so far when interrupted).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn reply(
        &mut self,
        session: &mut Session,
        tok: &Tokenizer,
        plan: TurnPlan,
        sampler: &mut Sampler,
        opts: &ReplyOptions,
        on_event: impl FnMut(ChatEvent<'_>) -> bool,
    ) -> Result<TurnResult> {
        pollster::block_on(self.reply_async(session, tok, plan, sampler, opts, on_event))
    }

    /// [`Chat::reply`] for every platform (the browser awaits each token's logits).
    pub async fn reply_async(
        &mut self,
        session: &mut Session,
        tok: &Tokenizer,
        plan: TurnPlan,
        sampler: &mut Sampler,
        opts: &ReplyOptions,
        mut on_event: impl FnMut(ChatEvent<'_>) -> bool,
    ) -> Result<TurnResult> {
        let prompt = plan.prompt;
        let known = self.cached.len().min(session.pos);
        let reused = common_prefix(&self.cached[..known], &prompt)
            .min(plan.reused)
            .min(prompt.len().saturating_sub(1));
        session.truncate(reused);
        self.cached.truncate(reused);
        let mut text = TextStream::new(tok);
        let mut reply = ReplyText::new(opts.stop.clone(), plan.starts_in_reasoning);
        let mut interrupted = false;
        let mut decode_err = None;
        let eos = &opts.eos;
        let result = generate_events_async(
            session,
            &self.cached,
            &prompt[reused..],
            opts.max_tokens,
            sampler,
            eos,
            |e| match e {
                Event::Prefill { done, total } => {
                    let go = on_event(ChatEvent::Prefill { done, total });
                    interrupted |= !go;
                    go
                }
                Event::Token(id) => {
                    if !on_event(ChatEvent::Token(id)) {
                        interrupted = true;
                        return false;
                    }
                    if eos.contains(&id) {
                        return true;
                    }
                    let piece = match text.push(id) {
                        Ok(p) => p,
                        Err(e) => {
                            decode_err = Some(e);
                            return false;
                        }
                    };
                    for (part, s) in reply.push(&piece) {
                        if !on_event(ChatEvent::Text(part, &s)) {
                            interrupted = true;
                            return false;
                        }
                    }
                    !reply.stopped()
                }
            },
        )
        .await;
        let (out, stop) = match result {
            Ok(r) => r,
            Err(e) => {
                let keep = session.pos.min(prompt.len());
                session.truncate(keep);
                self.cached = prompt[..keep].to_vec();
                return Err(e);
            }
        };
        let mut all = prompt.clone();
        all.extend_from_slice(&out);
        self.cached = all[..session.pos.min(all.len())].to_vec();
        session.truncate(self.cached.len());
        if let Some(e) = decode_err {
            return Err(e);
        }
        for (part, s) in reply.finish() {
            on_event(ChatEvent::Text(part, &s));
        }
        let end = match stop {
            Stop::Eos => ReplyEnd::Eos,
            Stop::MaxTokens => ReplyEnd::MaxTokens,
            Stop::ContextFull => ReplyEnd::ContextFull,
            Stop::Callback if interrupted => ReplyEnd::Interrupted,
            Stop::Callback => ReplyEnd::StopString,
        };
        let prefilled = session.pos.min(prompt.len()).saturating_sub(reused);
        let message = if end == ReplyEnd::Interrupted && reply.is_empty() {
            // Nothing was said (no token, or only tokens with no text yet, as after a Ctrl-C
            // at the first token): take the question back out rather than store an empty
            // reply.
            if self.conversation.messages.last().map(|m| m.role.as_str()) == Some("user") {
                self.conversation.messages.pop();
            }
            None
        } else {
            let m = reply.message();
            self.conversation.messages.push(m.clone());
            Some(m)
        };
        Ok(TurnResult {
            end,
            prompt_tokens: prompt.len(),
            reused,
            prefilled,
            generated: out.len(),
            message,
        })
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bard_tokenizer() -> Tokenizer {
        let dir = crate::config::bard_dir();
        Tokenizer::from_dir(&dir).unwrap()
    }

    fn bard_format() -> ChatFormat {
        let dir = crate::config::bard_dir();
        ChatFormat::new(ChatTemplate::from_dir(&dir).unwrap())
    }

    fn msg(role: &str, content: &str) -> Message {
        Message::new(role, content)
    }

    #[test]
    fn system_prompt_and_turn_dropping() {
        let mut c = Conversation::new(Some("Be brief.".into()));
        assert_eq!(c.system(), Some("Be brief."));
        c.messages.extend([
            msg("user", "a"),
            msg("assistant", "A"),
            msg("user", "b"),
            msg("assistant", "B"),
            msg("user", "c"),
        ]);
        assert_eq!(c.turns(), 3);
        assert!(c.drop_oldest_turn());
        assert_eq!(c.messages[1], msg("user", "b"));
        assert!(c.drop_oldest_turn());
        assert_eq!(
            c.messages,
            vec![msg("system", "Be brief."), msg("user", "c")]
        );
        assert!(!c.drop_oldest_turn(), "the newest turn stays");
        c.set_system(Some("New.".into()));
        assert_eq!(c.messages, vec![msg("system", "New."), msg("user", "c")]);
        c.set_system(None);
        assert_eq!(c.messages, vec![msg("user", "c")]);
        assert!(!c.drop_oldest_turn());
        c.set_system(Some("S".into()));
        c.clear();
        assert_eq!(c.messages, vec![msg("system", "S")]);
        assert!(!c.drop_oldest_turn());
    }

    #[test]
    fn json_round_trip_and_errors() {
        let mut c = Conversation::new(Some("sys".into()));
        c.messages.push(msg("user", "hi \"there\""));
        let mut a = msg("assistant", "ok");
        a.reasoning_content = Some("hmm".into());
        c.messages.push(a);
        let text = c.to_json();
        assert!(text.contains("\"messages\""), "{text}");
        assert_eq!(Conversation::from_json(&text).unwrap(), c);
        let bare = r#"[{"role": "user", "content": "x"}]"#;
        assert_eq!(
            Conversation::from_json(bare).unwrap().messages,
            vec![msg("user", "x")]
        );
        let e = Conversation::from_json(r#"{"messages": [{"role": "user"}]}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("message 1") && e.contains("content"), "{e}");
        assert!(Conversation::from_json("{}").is_err());
        assert!(Conversation::from_json("nope").is_err());
    }

    #[test]
    fn reply_text_splits_reasoning_and_cuts_at_stop_strings() {
        let mut r = ReplyText::new(vec!["STOP".into()], false);
        let mut got = Vec::new();
        for piece in [
            "<th",
            "ink>let me ",
            "see</thi",
            "nk>\nThe answer",
            " is 4.ST",
            "OP more",
        ] {
            got.extend(r.push(piece));
        }
        got.extend(r.finish());
        assert!(r.stopped());
        let join = |p: Part| {
            got.iter()
                .filter(|(q, _)| *q == p)
                .map(|(_, s)| s.as_str())
                .collect::<String>()
        };
        assert_eq!(join(Part::Reasoning), "let me see");
        assert_eq!(join(Part::Content), "\nThe answer is 4.");
        let m = r.message();
        assert_eq!(m.content, "The answer is 4.");
        assert_eq!(m.reasoning_content.as_deref(), Some("let me see"));

        // A prompt ending in <think>: the reply starts as reasoning.
        let mut r = ReplyText::new(vec![], true);
        let mut got = r.push("plan</think>done");
        got.extend(r.finish());
        assert_eq!(
            got,
            vec![
                (Part::Reasoning, "plan".to_string()),
                (Part::Content, "done".to_string())
            ]
        );
        // No tags: all content, no reasoning field; a held "<" comes out at the end.
        let mut r = ReplyText::new(vec![], false);
        assert_eq!(r.push("a <"), vec![(Part::Content, "a ".to_string())]);
        assert_eq!(r.finish(), vec![(Part::Content, "<".to_string())]);
        assert_eq!(r.message().reasoning_content, None);
    }

    #[test]
    fn prepare_reuses_the_cached_prefix_and_fits_the_context() {
        let tok = bard_tokenizer();
        let mut chat = Chat::new(bard_format(), None);
        let Prepared::Ready(p) = chat.prepare(&tok, "Good morrow.", 1000, 10).unwrap() else {
            panic!("fits")
        };
        assert_eq!(p.text, "[gMASK]<sop><|user|>\nGood morrow.<|assistant|>\n");
        assert_eq!(
            &p.prompt[..3],
            &[2, 4, 7],
            "encode_raw: the template's own specials"
        );
        assert_eq!(p.reused, 0);
        // Pretend the first turn ran: the caches hold the prompt and a reply.
        let reply = tok.encode_raw("What news?").unwrap();
        chat.cached = p.prompt.clone();
        chat.cached.extend(&reply);
        chat.conversation
            .messages
            .push(msg("assistant", "What news?"));
        let Prepared::Ready(q) = chat.prepare(&tok, "None.", 1000, 10).unwrap() else {
            panic!("fits")
        };
        assert_eq!(q.reused, p.prompt.len() + reply.len());
        assert_eq!(&q.prompt[..q.reused], chat.cached());
        assert_eq!(q.dropped_turns, 0);

        // A small context drops old turns (the system prompt stays). The context is just what
        // the conversation without its first turn needs, so that one drop would fit; drops go
        // on until half the context is free, which here leaves only the newest turn.
        chat.conversation
            .messages
            .push(msg("assistant", "Fare thee well."));
        chat.conversation.set_system(Some("Speak.".into()));
        let mut one_dropped = chat.conversation.clone();
        one_dropped.messages.push(msg("user", "Then farewell."));
        one_dropped.messages.drain(1..3);
        let encode = |c: &Conversation| chat.format.encode(&tok, &chat.format.render(c).unwrap());
        let ctx = encode(&one_dropped).unwrap().len() + 4;
        let mut expected = one_dropped.clone();
        expected.messages.drain(1..3);
        let need = encode(&expected).unwrap();
        assert!(
            need.len() + 4 > ctx / 2,
            "the newest turn alone takes over half"
        );
        let Prepared::Ready(r) = chat.prepare(&tok, "Then farewell.", ctx, 4).unwrap() else {
            panic!("fits after dropping")
        };
        assert_eq!(r.dropped_turns, 2);
        assert_eq!(chat.conversation, expected);
        assert_eq!(chat.conversation.system(), Some("Speak."));
        assert_eq!(r.prompt, need);
        // ... and a message that cannot fit alone is refused, leaving the conversation as it was.
        let before = chat.conversation.clone();
        let long = "word ".repeat(200);
        match chat.prepare(&tok, &long, 64, 16).unwrap() {
            Prepared::TooLong { tokens, room } => {
                assert!(tokens > 64);
                assert_eq!(room, 48);
            }
            Prepared::Ready(_) => panic!("200 words do not fit in 64 tokens"),
        }
        assert_eq!(chat.conversation, before);
    }

    #[test]
    fn plain_fallback_encodes_with_the_tokenizer_prefix_and_thinking_needs_support() {
        let tok = bard_tokenizer();
        let mut f = ChatFormat::new(None);
        assert!(f.is_plain());
        assert!(
            !f.set_thinking(true),
            "the plain template has no thinking switch"
        );
        let c = Conversation {
            messages: vec![msg("user", "Hi")],
        };
        let text = f.render(&c).unwrap();
        assert_eq!(text, "User: Hi\n\nAssistant:");
        let ids = f.encode(&tok, &text).unwrap();
        assert_eq!(&ids[..2], &[2, 4], "the tokenizer's [gMASK]<sop>");
        assert!(!bard_format().set_thinking(false));
    }

    #[test]
    fn reply_reserve_is_capped_at_a_quarter_of_the_context() {
        assert_eq!(reply_reserve(512, 4096), 512);
        assert_eq!(reply_reserve(512, 1024), 256);
        assert_eq!(reply_reserve(512, 2), 1);
    }
}
