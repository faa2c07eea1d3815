//! Chat prompts: a conversation rendered to the text the model was trained on.
//!
//! [`ChatTemplate`] renders the model's own Jinja `chat_template` (from `tokenizer_config.json`,
//! or from `chat_template.jinja`, which wins as in transformers) with the semantics of Hugging Face
//! transformers' `apply_chat_template(..., tokenize=False)`: the same variables (`messages`,
//! `add_generation_prompt`, the named special tokens such as `bos_token` / `eos_token`, `tools`,
//! `documents`, and any extra keyword such as `enable_thinking`), the same whitespace options and
//! the same helpers (`raise_exception`, `strftime_now`, the `tojson` filter with Python's
//! `json.dumps` arguments). The rendered text already contains the special tokens, so it is
//! tokenized with [`Tokenizer::encode_raw`](crate::tokenizer::Tokenizer::encode_raw), as
//! `apply_chat_template(tokenize=True)` does.
//!
//! A model without a template gets [`ChatTemplate::plain`], a documented plain-text layout.
//!
//! The conformance data is `tests/data/chat/expected.json`, written by
//! `tests/reference/make_chat_refs.py` with transformers itself; `tests/chat_template.rs` checks
//! that every case renders byte for byte the same.
//!
//! [`Chat`] (in `conversation.rs`) holds a multi-turn conversation against one session: prefix
//! reuse of the caches between turns, the context-overflow policy, reasoning and stop strings.
mod conversation;
mod template;

pub use conversation::{
    reply_reserve, Chat, ChatEvent, ChatFormat, Conversation, Part, Prepared, ReplyEnd,
    ReplyOptions, ReplyText, TurnPlan, TurnResult,
};
pub use template::{ChatTemplate, Message};
