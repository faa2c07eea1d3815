//! The bodies of the fuzz targets in `fuzz/` (cargo-fuzz, libFuzzer), as plain functions so
//! that `tests/fuzz_corpus.rs` can run the committed seeds and regression inputs through the
//! same code on stable Rust.
//!
//! Each function feeds untrusted bytes to one parser and then uses what it returns the way
//! sparsa does. A function may return early on an `Err` (a clear error is the expected outcome
//! of bad input); it must never panic, hang or allocate without bound. Several targets take two
//! inputs, which they cut out of the one byte string at the first [`SEPARATOR`] byte.
#![doc(hidden)]

use crate::chat::{ChatFormat, ChatTemplate, Conversation, Message};
use crate::config::Config;
use crate::tokenizer::{TextStream, Tokenizer};
use crate::weights::WeightFiles;
use std::path::Path;

/// Splits a two-part input (a NUL byte never occurs in the JSON or Jinja text of a real file).
pub const SEPARATOR: u8 = 0;

/// Splits the safetensors target's input into shards.
pub const SHARD_MARKER: &[u8] = b"\xffSPARSA-SHARD\xff";

/// Tensors up to this many bytes are also decoded to f32 (norms and biases are).
const DECODE_LIMIT: usize = 1 << 16;

fn split2(data: &[u8]) -> (&[u8], Option<&[u8]>) {
    match data.iter().position(|&b| b == SEPARATOR) {
        Some(i) => (&data[..i], Some(&data[i + 1..])),
        None => (data, None),
    }
}

fn text(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(bytes)
}

fn shards(data: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut rest = data;
    loop {
        let name = format!("model-{:05}.safetensors", out.len() + 1);
        match find(rest, SHARD_MARKER) {
            Some(i) if out.len() < 7 => {
                out.push((name, rest[..i].to_vec()));
                rest = &rest[i + SHARD_MARKER.len()..];
            }
            _ => {
                out.push((name, rest.to_vec()));
                return out;
            }
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Every tensor of opened weight files, read as the loader reads it.
fn use_weights(w: &WeightFiles) {
    let _ = w.total_bytes();
    let names: Vec<String> = w.names().map(str::to_string).collect();
    for name in &names {
        let t = match w.get(name) {
            Ok(t) => t,
            Err(_) => continue,
        };
        let _ = t.numel();
        let _ = t.expect_shape(&[t.numel()]);
        if t.bytes.len() <= DECODE_LIMIT {
            let _ = t.to_f32();
        }
    }
}

/// Setup for every fuzz target: libFuzzer's panic hook aborts on any panic, even one that
/// sparsa catches on purpose (see [`crate::error::catch_panic`]); this hook lets those pass
/// and keeps aborting on every other.
pub fn init() {
    let abort = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !crate::error::catching_panic() {
            abort(info);
        }
    }));
}

/// `safetensors`: the input as one file, and split at [`SHARD_MARKER`] into shards.
pub fn safetensors(data: &[u8]) {
    if let Ok(w) = WeightFiles::from_owned(vec![("model.safetensors".to_string(), data.to_vec())]) {
        use_weights(&w);
    }
    if find(data, SHARD_MARKER).is_some() {
        if let Ok(w) = WeightFiles::from_owned(shards(data)) {
            use_weights(&w);
        }
    }
}

/// `shard_index`: the text of a `model.safetensors.index.json`.
pub fn shard_index(data: &[u8]) {
    let _ =
        crate::weights::parse_shard_index(&text(data), Path::new("model.safetensors.index.json"));
}

/// `config`: `config.json`, then optionally `generation_config.json` after a [`SEPARATOR`].
pub fn config(data: &[u8]) {
    let (cfg, gen) = split2(data);
    let gen = gen.map(text);
    let Ok(c) = Config::from_texts(
        &text(cfg),
        "config.json",
        gen.as_deref()
            .map(|g| (g, "generation_config.json".to_string())),
    ) else {
        return;
    };
    let _ = c.qk_head_dim();
    let _ = c.softmax_scale();
    let _ = c.n_full_layers();
    for i in 0..c.num_hidden_layers.min(4096) {
        let _ = c.is_dense_layer(i);
    }
}

/// `quant_meta`: a `config.json` whose `quantization_config` is read, then after a
/// [`SEPARATOR`] a safetensors file whose quantized tensors are checked against it and
/// dequantized on the CPU.
pub fn quant_meta(data: &[u8]) {
    let (cfg, file) = split2(data);
    let Ok(q) = crate::config::quantization_config(&text(cfg), "config.json") else {
        return;
    };
    let Some(file) = file else { return };
    let Ok(w) = WeightFiles::from_owned(vec![("model.safetensors".to_string(), file.to_vec())])
    else {
        return;
    };
    let names: Vec<String> = w.names().map(str::to_string).collect();
    for name in &names {
        let _ = crate::weights::quant::check_stored(&w, name, q, DECODE_LIMIT);
    }
}

/// A short text with ASCII, multi-byte characters and GLM's special tokens.
const SAMPLE: &str = "[gMASK]<sop><|user|>\nHello, wörld! 你好 🙂\t<|assistant|><think>";

/// `tokenizer`: a `tokenizer.json`; encode and decode a fixed text, decode ids taken from the
/// end of the input, stream them.
pub fn tokenizer(data: &[u8]) {
    let Ok(tok) = Tokenizer::from_bytes(data) else {
        return;
    };
    if let Ok(ids) = tok.encode(SAMPLE) {
        let _ = tok.decode(&ids);
    }
    let _ = tok.encode_raw(SAMPLE);
    let tail = &data[data.len().saturating_sub(32)..];
    let ids: Vec<u32> = tail
        .chunks(4)
        .map(|c| c.iter().fold(0u32, |a, &b| (a << 8) | b as u32) % 4096)
        .collect();
    let _ = tok.decode(&ids);
    let mut stream = TextStream::new(&tok);
    for id in ids {
        if stream.push(id).is_err() {
            break;
        }
    }
}

/// The conversation the chat-template target renders.
fn messages() -> Vec<Message> {
    vec![
        Message::new("system", "Be brief."),
        Message::new("user", "Hi <b>there</b> 🙂"),
        Message {
            role: "assistant".into(),
            content: "Hello!".into(),
            reasoning_content: Some("The user greets me.".into()),
        },
        Message::new("user", "What is 2+2?"),
    ]
}

/// The fuel base of a render in the fuzzer (the default is `chat::template::FUEL_BASE`): lower,
/// so that inputs that loop until the budget runs out stay cheap.
pub const FUZZ_FUEL_BASE: u64 = 20_000;

/// `chat_template`: a `tokenizer_config.json`, then optionally a `chat_template.jinja` after a
/// [`SEPARATOR`]; render a short conversation with a generation prompt.
pub fn chat_template(data: &[u8]) {
    let _ = chat_template_render(data);
}

/// The chat-template target's work: None when the config or template does not load (or has no
/// template), else the result of the render.
pub fn chat_template_render(data: &[u8]) -> Option<crate::Result<String>> {
    let (cfg, jinja) = split2(data);
    let jinja = jinja.map(text);
    let mut t = ChatTemplate::from_config_texts(&text(cfg), jinja.as_deref()).ok()??;
    t.set_fuel_base(FUZZ_FUEL_BASE);
    let _ = t.supports_thinking();
    let mut extra = serde_json::Map::new();
    extra.insert("enable_thinking".into(), serde_json::Value::Bool(false));
    Some(t.render(&messages(), true, &extra))
}

/// `conversation`: the JSON file of the chat's `/load` command; the loaded conversation is
/// saved again and rendered with the plain template.
pub fn conversation(data: &[u8]) {
    let Ok(mut c) = Conversation::from_json(&text(data)) else {
        return;
    };
    let _ = c.to_json();
    let _ = c.system();
    let _ = c.turns();
    let _ = ChatFormat::new(None).render(&c);
    while c.drop_oldest_turn() {}
    c.set_system(Some("s".into()));
    c.clear();
}
