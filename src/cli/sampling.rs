//! The sampling and stopping flags that `generate` and `chat` share: one definition, one help
//! text, one set of checks.

use clap::Args;
use sparsa::generate::SamplingParams;
use sparsa::{Error, Result};

#[derive(Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Most tokens to generate (in chat: per reply); -1 for no limit (until an end-of-sequence
    /// token, a --stop text or the end of the context). [default: 128 for generate, 1024 for
    /// chat]
    #[arg(short = 'n', long, value_name = "N", allow_hyphen_values = true, value_parser = parse_max_tokens)]
    pub max_tokens: Option<MaxTokens>,
    /// Sampling temperature; 0 is greedy (always the most likely token).
    #[arg(
        long,
        value_name = "T",
        default_value_t = 0.8,
        allow_hyphen_values = true
    )]
    pub temperature: f32,
    /// Nucleus sampling: keep the most likely tokens whose probabilities add up to P (1: all).
    #[arg(
        long,
        value_name = "P",
        default_value_t = 0.95,
        allow_hyphen_values = true
    )]
    pub top_p: f32,
    /// Keep only the K most likely tokens (0: all).
    #[arg(long, value_name = "K", default_value_t = 40, allow_hyphen_values = true, value_parser = parse_count)]
    pub top_k: usize,
    /// Drop tokens less likely than P times the most likely one (0: off).
    #[arg(
        long,
        value_name = "P",
        default_value_t = 0.0,
        allow_hyphen_values = true
    )]
    pub min_p: f32,
    /// Divide the logits of tokens seen in the last --repeat-last-n tokens by this (1: off).
    /// [default: 1.0 for generate, 1.1 for chat]
    #[arg(long, value_name = "X", allow_hyphen_values = true)]
    pub repeat_penalty: Option<f32>,
    /// How many recent tokens the repetition, presence and frequency penalties look at.
    #[arg(long, value_name = "N", default_value_t = 64, allow_hyphen_values = true, value_parser = parse_count)]
    pub repeat_last_n: usize,
    /// Subtract X from the logit of every token seen in the last --repeat-last-n tokens
    /// (OpenAI's presence_penalty; 0: off).
    #[arg(
        long,
        value_name = "X",
        default_value_t = 0.0,
        allow_hyphen_values = true
    )]
    pub presence_penalty: f32,
    /// Subtract X from a token's logit for each time it was seen in the last --repeat-last-n
    /// tokens (OpenAI's frequency_penalty; 0: off).
    #[arg(
        long,
        value_name = "X",
        default_value_t = 0.0,
        allow_hyphen_values = true
    )]
    pub frequency_penalty: f32,
    /// Random seed of the sampler. Default: a new one each run (printed with -v, so a run can
    /// be repeated with --seed).
    #[arg(long, value_name = "N", allow_hyphen_values = true, value_parser = parse_seed)]
    pub seed: Option<u64>,
    /// End the output at this text, which is not shown or kept (repeatable; \n, \t, \r and \\
    /// are read as escapes).
    #[arg(long, value_name = "TEXT")]
    pub stop: Vec<String>,
    /// Speculative decoding: draft N tokens per step with the model's multi-token-prediction
    /// layer and verify them in one forward (0: off). Greedy output is unchanged; sampled
    /// output keeps its distribution (speculative sampling's acceptance rule).
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = parse_count)]
    pub draft: usize,
    /// Keep writing past end-of-sequence tokens (for benchmarks and tests): the output then
    /// ends only at --max-tokens, a --stop text, Ctrl-C or the end of the context.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Print the seed, token counts and speeds on stderr.
    #[arg(short, long)]
    pub verbose: bool,
}

/// `--max-tokens`: a count, or no limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaxTokens {
    Count(usize),
    Unlimited,
}

impl MaxTokens {
    /// The count, `usize::MAX` for no limit.
    pub fn get(self) -> usize {
        match self {
            MaxTokens::Count(n) => n,
            MaxTokens::Unlimited => usize::MAX,
        }
    }
}

fn parse_max_tokens(s: &str) -> std::result::Result<MaxTokens, String> {
    let allowed = "expected a whole number ≥ 1, or -1 for no limit";
    match s.trim() {
        "-1" => Ok(MaxTokens::Unlimited),
        t => match t.parse::<usize>() {
            Ok(0) => Err(format!("0 tokens: {allowed}")),
            Ok(n) => Ok(MaxTokens::Count(n)),
            Err(_) => Err(allowed.into()),
        },
    }
}

pub(super) fn parse_count(s: &str) -> std::result::Result<usize, String> {
    s.trim()
        .parse::<usize>()
        .map_err(|_| "expected a whole number ≥ 0".into())
}

fn parse_seed(s: &str) -> std::result::Result<u64, String> {
    s.trim()
        .parse::<u64>()
        .map_err(|_| format!("expected a whole number from 0 to {}", u64::MAX))
}

/// A seed from the operating system's randomness (through the standard library's hasher
/// keys), for runs without --seed.
pub fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

impl SamplingArgs {
    /// `--max-tokens`, or `default` when not given.
    pub fn max_tokens_or(&self, default: usize) -> usize {
        self.max_tokens.map_or(default, MaxTokens::get)
    }

    /// The sampler's settings, checked (each bad value named by its flag); the seed is
    /// --seed or a fresh one. `repeat_penalty` is the command's default for that flag.
    pub fn params(&self, repeat_penalty: f32) -> Result<SamplingParams> {
        let p = SamplingParams {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            seed: self.seed.unwrap_or_else(fresh_seed),
            repeat_penalty: self.repeat_penalty.unwrap_or(repeat_penalty),
            repeat_last_n: self.repeat_last_n,
            min_p: self.min_p,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
        };
        let bad = |flag: &str, v: f32, want: &str| {
            Err(Error::msg(format!("--{flag} {v}: expected {want}")))
        };
        if !(p.temperature.is_finite() && p.temperature >= 0.0) {
            return bad("temperature", p.temperature, "a number ≥ 0 (0 is greedy)");
        }
        if !(p.top_p > 0.0 && p.top_p <= 1.0) {
            return bad("top-p", p.top_p, "a number in (0, 1] (1 keeps every token)");
        }
        if !(p.min_p >= 0.0 && p.min_p <= 1.0) {
            return bad("min-p", p.min_p, "a number in [0, 1] (0 is off)");
        }
        if !(p.repeat_penalty.is_finite() && p.repeat_penalty > 0.0) {
            return bad(
                "repeat-penalty",
                p.repeat_penalty,
                "a positive number (1 is off)",
            );
        }
        for (flag, v) in [
            ("presence-penalty", p.presence_penalty),
            ("frequency-penalty", p.frequency_penalty),
        ] {
            if !v.is_finite() {
                return bad(flag, v, "a finite number (0 is off)");
            }
        }
        Ok(p)
    }

    /// The --stop texts with their escapes read; an empty one is refused.
    pub fn stops(&self) -> Result<Vec<String>> {
        self.stop
            .iter()
            .map(|s| match unescape(s) {
                t if t.is_empty() => Err(Error::msg("--stop: the text is empty")),
                t => Ok(t),
            })
            .collect()
    }
}

/// `\n`, `\t`, `\r` and `\\` in a --stop value; any other backslash stays as it is.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some('\\') => out.push('\\'),
            Some(o) => {
                out.push('\\');
                out.push(o);
            }
            None => out.push('\\'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_values_are_unescaped() {
        assert_eq!(unescape(r"a\nb\tc\\d\qe\"), "a\nb\tc\\d\\qe\\");
        assert_eq!(unescape("plain"), "plain");
    }

    #[test]
    fn max_tokens_values() {
        assert_eq!(parse_max_tokens("5"), Ok(MaxTokens::Count(5)));
        assert_eq!(parse_max_tokens("-1"), Ok(MaxTokens::Unlimited));
        for bad in ["0", "-2", "x", "1.5"] {
            let e = parse_max_tokens(bad).unwrap_err();
            assert!(e.contains("-1 for no limit"), "{bad}: {e}");
        }
    }

    #[test]
    fn fresh_seeds_differ() {
        assert_ne!(fresh_seed(), fresh_seed());
    }
}
