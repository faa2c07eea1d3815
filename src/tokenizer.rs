//! The model's `tokenizer.json`, through the `tokenizers` crate.

use crate::error::{catch_panic, Error, Result};
use std::path::Path;

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
}

impl Tokenizer {
    pub fn from_dir(dir: &Path) -> Result<Tokenizer> {
        let path = dir.join("tokenizer.json");
        if !path.exists() {
            return Err(Error::msg(format!(
                "{}: missing (this model has no tokenizer; pass token ids with --tokens instead of --prompt)",
                path.display()
            )));
        }
        let what = format!("{}: cannot load tokenizer", path.display());
        let inner = catch_panic(&what, || {
            tokenizers::Tokenizer::from_file(&path).map_err(|e| Error::msg(format!("{what}: {e}")))
        })?;
        Ok(Tokenizer::wrap(inner))
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Tokenizer> {
        // The `tokenizers` crate panics on some malformed files (a syntax error inside the
        // decoder, a bad precompiled normalizer): caught, they are errors like the others.
        let inner = catch_panic("tokenizer.json", || {
            tokenizers::Tokenizer::from_bytes(bytes)
                .map_err(|e| Error::msg(format!("tokenizer.json: {e}")))
        })?;
        Ok(Tokenizer::wrap(inner))
    }

    /// sparsa encodes a prompt whole: the file's `padding` and `truncation` (meant for
    /// batching) are dropped. Kept, a `"Fixed"` padding length from the file would make every
    /// encode allocate that many tokens, and truncation would silently cut prompts.
    fn wrap(mut inner: tokenizers::Tokenizer) -> Tokenizer {
        inner.with_padding(None);
        let _ = inner.with_truncation(None);
        Tokenizer { inner }
    }

    /// Token ids of `text`, with the special tokens the tokenizer's post-processor adds
    /// (e.g. GLM's `[gMASK]<sop>`), as transformers' `tokenizer(text)` does.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.tokenize(text, true)
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        catch_panic("tokenizer.json: decoding tokens", || {
            self.inner
                .decode(ids, false)
                .map_err(|e| Error::msg(format!("decoding tokens: {e}")))
        })
    }

    /// Token ids of `text`, with the post-processor's special tokens when `special`.
    fn tokenize(&self, text: &str, special: bool) -> Result<Vec<u32>> {
        catch_panic("tokenizer.json: tokenizing the prompt", || {
            let enc = self
                .inner
                .encode(text, special)
                .map_err(|e| Error::msg(format!("tokenizing the prompt: {e}")))?;
            Ok(enc.get_ids().to_vec())
        })
    }

    /// Token ids of `text` without the post-processor's special tokens: what transformers'
    /// `apply_chat_template(tokenize=True)` does with a rendered chat, whose template already
    /// wrote the special tokens (`[gMASK]<sop>`, `<|user|>`, ...) into the text.
    pub fn encode_raw(&self, text: &str) -> Result<Vec<u32>> {
        self.tokenize(text, false)
    }
}

/// Streams text for a growing token list: decodes everything generated so far and returns
/// only the new, complete part (so multi-byte characters split across tokens come out whole).
pub struct TextStream<'t> {
    tok: &'t Tokenizer,
    ids: Vec<u32>,
    printed: usize,
}

impl<'t> TextStream<'t> {
    pub fn new(tok: &'t Tokenizer) -> Self {
        TextStream {
            tok,
            ids: Vec::new(),
            printed: 0,
        }
    }

    /// A stream whose text continues `context` (the prompt): tokens are decoded after the
    /// last few context tokens, so the first piece's leading space comes out as it does in
    /// the whole text (decoded alone, a word-start token may gain or lose its space).
    pub fn after(tok: &'t Tokenizer, context: &[u32]) -> Result<Self> {
        const CONTEXT_TOKENS: usize = 8;
        let ids = context[context.len().saturating_sub(CONTEXT_TOKENS)..].to_vec();
        let text = tok.decode(&ids)?;
        // A context ending inside a character is left out: its bytes would change.
        let ids = if text.ends_with('\u{FFFD}') {
            Vec::new()
        } else {
            ids
        };
        let printed = if ids.is_empty() { 0 } else { text.len() };
        Ok(TextStream { tok, ids, printed })
    }

    pub fn push(&mut self, id: u32) -> Result<String> {
        self.ids.push(id);
        let text = self.tok.decode(&self.ids)?;
        if text.ends_with('\u{FFFD}')
            || text.len() < self.printed
            || !text.is_char_boundary(self.printed)
        {
            return Ok(String::new());
        }
        let new = text[self.printed..].to_string();
        self.printed = text.len();
        Ok(new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by fuzzing (fuzz/regressions/tokenizer/): the `tokenizers` crate panics on a
    /// syntax error inside the decoder (`expect("Helper")`) and on a precompiled normalizer
    /// that does not parse (`expect("Precompiled")`). Both are errors naming the file.
    #[test]
    fn tokenizer_crate_panics_become_errors() {
        let broken_decoder =
            include_bytes!("../fuzz/regressions/tokenizer/decoder-syntax-error-panic");
        let bad_precompiled = br#"{"version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [], "pre_tokenizer": null, "post_processor": null, "decoder": null,
            "normalizer": {"type": "Precompiled", "precompiled_charsmap": "AAAA"},
            "model": {"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "a"}}"#;
        for bytes in [broken_decoder.as_slice(), bad_precompiled.as_slice()] {
            let e = Tokenizer::from_bytes(bytes)
                .err()
                .expect("an error, not a tokenizer")
                .0;
            assert!(e.starts_with("tokenizer.json: "), "{e}");
            assert!(!crate::error::catching_panic(), "the catch is over");
        }
    }

    /// A hostile tokenizer.json: padding to a fixed length of 2^40 tokens made every encode
    /// run out of memory; sparsa drops the file's padding and truncation.
    #[test]
    fn file_padding_and_truncation_are_ignored() {
        let json = r#"{"version": "1.0",
            "truncation": {"direction": "Right", "max_length": 1, "strategy": "LongestFirst", "stride": 0},
            "padding": {"strategy": {"Fixed": 1099511627776}, "direction": "Right",
                "pad_to_multiple_of": null, "pad_id": 0, "pad_type_id": 0, "pad_token": "<unk>"},
            "added_tokens": [], "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
            "post_processor": null, "decoder": null,
            "model": {"type": "WordLevel", "vocab": {"<unk>": 0, "hello": 1, "world": 2}, "unk_token": "<unk>"}}"#;
        let t = Tokenizer::from_bytes(json.as_bytes()).unwrap();
        assert_eq!(t.encode("hello world").unwrap(), [1, 2]);
    }

    fn bard() -> Tokenizer {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/sparsa-bard-12m");
        Tokenizer::from_dir(&dir).expect("the bard tokenizer loads")
    }

    #[test]
    fn encode_raw_adds_no_special_tokens() {
        let tok = bard();
        // The post-processor puts [gMASK]<sop> (ids 2, 4) in front of `encode`; `encode_raw`
        // leaves that to the text, so a rendered chat that starts with them gets them once.
        let plain = tok.encode("hello").unwrap();
        assert_eq!(&plain[..2], &[2, 4]);
        assert_eq!(tok.encode_raw("[gMASK]<sop>hello").unwrap(), plain);
        assert_eq!(tok.encode_raw("hello").unwrap(), &plain[2..]);
        let chat = tok
            .encode_raw("[gMASK]<sop><|user|>\nhi<|assistant|>\n")
            .unwrap();
        assert_eq!(&chat[..3], &[2, 4, 7]);
        assert_eq!(chat.iter().filter(|&&id| id == 2).count(), 1);
    }
}
