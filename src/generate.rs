//! Token sampling, the generation loop and stop strings.

use crate::error::Result;
use crate::knobs::{knob, knob_on};
use crate::model::{Pick, Session};
pub use crate::sampling::{
    apply_count_penalties, apply_repeat_penalty, argmax, sample_logits, Sampler, SamplingParams,
};

/// Why generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    Eos,
    MaxTokens,
    ContextFull,
    Callback,
}

/// What [`generate_events`] reports while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// `done` of the `total` prompt tokens are in the caches (after each prefill chunk).
    Prefill { done: usize, total: usize },
    /// A sampled token (an eos token included).
    Token(u32),
}

/// Prefill `prompt` (appended to whatever the session holds), then sample up to
/// `max_tokens` tokens. `on_token` sees each token as it is produced and may return false
/// to stop. Returns the generated tokens (an eos token is included) and why it stopped.
///
/// The last token returned is never run through the model, so afterwards the session holds
/// the prompt and all generated tokens but the last.
#[cfg(not(target_arch = "wasm32"))]
pub fn generate(
    session: &mut Session,
    prompt: &[u32],
    max_tokens: usize,
    sampler: &mut Sampler,
    eos: &[u32],
    mut on_token: impl FnMut(u32) -> bool,
) -> Result<(Vec<u32>, Stop)> {
    generate_events(
        session,
        &[],
        prompt,
        max_tokens,
        sampler,
        eos,
        |e| match e {
            Event::Token(id) => on_token(id),
            Event::Prefill { .. } => true,
        },
    )
}

/// [`generate`] with progress events: the prompt is prefilled in chunks of `session.chunk`
/// tokens and `on_event` sees an [`Event::Prefill`] after each, then an [`Event::Token`] per
/// token; returning false stops ([`Stop::Callback`]; during the prefill, with no tokens and the
/// session holding the chunks done so far). `history` is the text already in the session
/// before `prompt`, which the repetition penalty looks back into.
#[cfg(not(target_arch = "wasm32"))]
pub fn generate_events(
    session: &mut Session,
    history: &[u32],
    prompt: &[u32],
    max_tokens: usize,
    sampler: &mut Sampler,
    eos: &[u32],
    on_event: impl FnMut(Event) -> bool,
) -> Result<(Vec<u32>, Stop)> {
    pollster::block_on(generate_events_async(
        session, history, prompt, max_tokens, sampler, eos, on_event,
    ))
}

/// [`generate_events`] for every platform: the browser awaits each token's logits (natively
/// every await is ready at once). The events arrive between the GPU steps, so a page can
/// show each token as it comes.
pub async fn generate_events_async(
    session: &mut Session,
    history: &[u32],
    prompt: &[u32],
    max_tokens: usize,
    sampler: &mut Sampler,
    eos: &[u32],
    mut on_event: impl FnMut(Event) -> bool,
) -> Result<(Vec<u32>, Stop)> {
    let mut out = Vec::new();
    if max_tokens == 0 {
        return Ok((out, Stop::MaxTokens));
    }
    if prompt.is_empty() {
        return Err(crate::error::Error::msg(
            "empty prompt: at least one token is needed",
        ));
    }
    if session.pos + prompt.len() > session.max_ctx() {
        return Err(crate::error::Error::msg(format!(
            "context full: {} cached + {} new tokens exceed --ctx {}",
            session.pos,
            prompt.len(),
            session.max_ctx()
        )));
    }
    if session.drafts() > 0 {
        return speculative(session, history, prompt, max_tokens, sampler, eos, on_event).await;
    }
    if sampler.gpu_can_pick() {
        return pipelined(session, history, prompt, max_tokens, sampler, eos, on_event).await;
    }
    // The last `window` tokens of history + prompt + output, for the repetition penalty.
    let window = sampler.params.repeat_last_n;
    let mut recent: Vec<u32> = history[history.len().saturating_sub(window)..].to_vec();
    let mut logits = None;
    let mut done = 0;
    for part in prompt.chunks(session.chunk.max(1)) {
        logits = Some(session.forward_async(part, false).await?);
        done += part.len();
        if !on_event(Event::Prefill {
            done,
            total: prompt.len(),
        }) {
            return Ok((out, Stop::Callback));
        }
    }
    recent.extend_from_slice(&prompt[prompt.len().saturating_sub(window)..]);
    let Some(logits) = logits else {
        return Ok((out, Stop::MaxTokens));
    };
    let mut next = sampler.sample_after(logits.last(), &recent);
    loop {
        out.push(next);
        recent.push(next);
        keep_last(&mut recent, window);
        let (pos, max_ctx) = (session.pos, session.max_ctx());
        if let Some(stop) = stop_after(&out, &mut on_event, eos, max_tokens, pos, max_ctx) {
            return Ok((out, stop));
        }
        let logits = session.forward_async(&[next], false).await?;
        next = sampler.sample_after(logits.last(), &recent);
    }
}

/// Keeps the repetition penalty's window: drops all but the last `window` tokens once
/// `recent` holds twice as many (amortized).
fn keep_last(recent: &mut Vec<u32>, window: usize) {
    if recent.len() > 2 * window.max(1) {
        recent.drain(..recent.len() - window);
    }
}

/// Whether generation stops after the token just pushed to `out` (the checks in order: the
/// callback, eos, the token budget, a full context).
fn stop_after(
    out: &[u32],
    on_event: &mut impl FnMut(Event) -> bool,
    eos: &[u32],
    max_tokens: usize,
    pos: usize,
    max_ctx: usize,
) -> Option<Stop> {
    let next = out[out.len() - 1];
    if !on_event(Event::Token(next)) {
        Some(Stop::Callback)
    } else if eos.contains(&next) {
        Some(Stop::Eos)
    } else if out.len() >= max_tokens {
        Some(Stop::MaxTokens)
    } else if pos >= max_ctx {
        Some(Stop::ContextFull)
    } else {
        None
    }
}

/// Generation with drafts from the model's MTP layer (`model/draft.rs`): each round drafts
/// up to `session.drafts()` tokens (greedily), verifies them with one forward of the main
/// model and emits the accepted prefix and the main model's token after it. Greedy: a draft
/// is accepted when it is the argmax, so the output is the non-speculative output. Sampling:
/// speculative sampling's rule ([`Sampler::verify_draft`]), so every token has the
/// distribution the sampler draws from without drafts (not the same draws). Afterwards the
/// session holds the prompt and all generated tokens but the last, as on the other paths
/// (the MTP layer's caches too).
async fn speculative(
    session: &mut Session,
    history: &[u32],
    prompt: &[u32],
    max_tokens: usize,
    sampler: &mut Sampler,
    eos: &[u32],
    mut on_event: impl FnMut(Event) -> bool,
) -> Result<(Vec<u32>, Stop)> {
    let window = sampler.params.repeat_last_n;
    let mut recent: Vec<u32> = history[history.len().saturating_sub(window)..].to_vec();
    let mut out = Vec::new();
    let parts: Vec<&[u32]> = prompt.chunks(session.chunk.max(1)).collect();
    let (mut next, mut done) = (0, 0);
    for (c, part) in parts.iter().enumerate() {
        let following = parts.get(c + 1).map(|p| p[0]);
        if following.is_none() {
            recent.extend_from_slice(&prompt[prompt.len().saturating_sub(window)..]);
        }
        if let Some(t) = speculative_chunk(session, part, following, sampler, &recent).await? {
            next = t;
        }
        done += part.len();
        if !on_event(Event::Prefill {
            done,
            total: prompt.len(),
        }) {
            return Ok((out, Stop::Callback));
        }
    }
    out.push(next);
    recent.push(next);
    let (pos, max_ctx) = (session.pos, session.max_ctx());
    if let Some(stop) = stop_after(&out, &mut on_event, eos, max_tokens, pos, max_ctx) {
        return Ok((out, stop));
    }
    let p = &sampler.params;
    if p.is_greedy() && !p.penalizes() && session.gpu_rounds_fit() && knob_on!("SPARSA_GPU_ROUNDS")
    {
        let (ends, before) = ((max_tokens, eos), out.len());
        let stopped = gpu_rounds(session, next, &mut out, ends, &mut on_event).await;
        // The rounds' recordings hold the buffers they bind: none outlives the rounds.
        session.drop_round_recordings();
        if let Some(stop) = stopped? {
            return Ok((out, stop));
        }
        // Near the end of the context or of the reply: the host's rounds finish it.
        next = out[out.len() - 1];
        recent.extend_from_slice(&out[before..]);
        keep_last(&mut recent, window);
    }
    loop {
        let p = session.pos;
        let k = round_drafts(session, max_tokens - out.len());
        let emitted = speculative_round(session, next, k, sampler, &recent).await?;
        // Emit in order until a stop.
        let mut stop = None;
        let mut m = 0;
        for &g in &emitted {
            out.push(g);
            recent.push(g);
            keep_last(&mut recent, window);
            m += 1;
            stop = stop_after(
                &out,
                &mut on_event,
                eos,
                max_tokens,
                p + m,
                session.max_ctx(),
            );
            if stop.is_some() {
                break;
            }
        }
        speculative_keep(session, p, &emitted[..m])?;
        next = emitted[m - 1];
        if let Some(stop) = stop {
            return Ok((out, stop));
        }
    }
}

/// Greedy rounds without penalties, queued on the GPU up to [`round_depth`] ahead of the
/// host ([`Session::gpu_round`]): the GPU accepts the drafts, keeps the position and drafts
/// the next round's d_1 itself, so the next round is queued before this one's tokens come
/// back, as pipelined decode steps are. The host reads each round's tokens (a few bytes)
/// and stops as the host's rounds do. Returns the stop, or None where the context or the
/// token budget leaves no room to queue another round at the host's bound on the position
/// (the session then holds what was emitted, as after a host round). Rounds still queued
/// after a stop only write rows past the session's position, which nothing reads.
async fn gpu_rounds(
    session: &mut Session,
    next: u32,
    out: &mut Vec<u32>,
    (max_tokens, eos): (usize, &[u32]),
    on_event: &mut impl FnMut(Event) -> bool,
) -> Result<Option<Stop>> {
    let k = session.drafts();
    let max_ctx = session.max_ctx();
    session.begin_gpu_rounds(next)?;
    // The first position of the oldest round queued and not yet read.
    let mut known = session.pos;
    // The read-back slots of the rounds queued, oldest first.
    let mut queued = std::collections::VecDeque::new();
    loop {
        // Each queued round emits 1 ..= k + 1 tokens: bound the next one's position by the
        // most, and stop queueing once the fewest would reach the budget.
        while queued.len() < round_depth() {
            let most = known + queued.len() * (k + 1);
            if most + k + 1 > max_ctx || out.len() + queued.len() >= max_tokens {
                break;
            }
            queued.push_back(session.gpu_round(most)?);
        }
        let Some(s) = queued.pop_front() else {
            session.pos = known;
            return Ok(None);
        };
        let emitted = session.read_gpu_round(s).await?;
        for (m, &g) in emitted.iter().enumerate() {
            out.push(g);
            let pos = known + m + 1;
            if let Some(stop) = stop_after(out, on_event, eos, max_tokens, pos, max_ctx) {
                session.pos = pos;
                return Ok(Some(stop));
            }
        }
        known += emitted.len();
    }
}

/// Rounds [`gpu_rounds`] keeps queued: 2, so the GPU runs one while the host records the
/// next; `SPARSA_ROUND_DEPTH` sets 1 (each waited for, a measurement aid) to 3 (the
/// read-back slots [`Session::gpu_round`] has).
fn round_depth() -> usize {
    knob!("SPARSA_ROUND_DEPTH", |v| (1..=3).contains(&v)).unwrap_or(2) as usize
}

/// One prompt chunk of a speculative decode: the main model over `part` (at `session.pos`)
/// keeping its hidden rows, then the MTP layer over them paired with the tokens one further
/// on: `part`'s own, then `following` (the next chunk's first token) or, after the last
/// chunk (`following` None), the token the main model picks there (sampled after `recent`),
/// which is returned. The MTP layer's last row drafts d_1 into `ids[1]` on the GPU.
pub(crate) async fn speculative_chunk(
    session: &mut Session,
    part: &[u32],
    following: Option<u32>,
    sampler: &mut Sampler,
    recent: &[u32],
) -> Result<Option<u32>> {
    let pos0 = session.pos;
    let logits = session
        .forward_keep_hidden(part, usize::from(following.is_none()))
        .await?;
    let next = following.unwrap_or_else(|| sampler.sample_after(&logits, recent));
    let mut shifted = part[1..].to_vec();
    shifted.push(next);
    session.mtp_pass(&shifted, pos0)?;
    Ok(following.is_none().then_some(next))
}

/// Drafts for the next speculative round when `left` more tokens may be emitted: as many as
/// can be emitted (a round emits at most k + 1) and verified within the context.
pub(crate) fn round_drafts(session: &Session, left: usize) -> usize {
    session
        .drafts()
        .min(left.saturating_sub(1))
        .min(session.max_ctx().saturating_sub(session.pos + 1))
}

/// One speculative round: `next` sits at `session.pos`, chosen (and emitted) but not yet
/// run, and d_1 waits in `ids[1]`. Drafts `k` tokens (each draft step reads the previous
/// draft from ids and picks the next into ids, on the GPU, without a wait), verifies
/// `[next, d_1 .. d_k]` in one forward and returns the tokens the round emits: the drafts
/// the sampler accepts (greedy: the main model's argmax; sampling: speculative sampling's
/// rule, `recent` the penalty window), then the main model's own token after them. The
/// caller keeps what it emits with [`speculative_keep`].
pub(crate) async fn speculative_round(
    session: &mut Session,
    next: u32,
    k: usize,
    sampler: &mut Sampler,
    recent: &[u32],
) -> Result<Vec<u32>> {
    let p = session.pos;
    session.put_tokens(&[next]);
    for j in 1..k {
        session.mtp_record(j as u32, 1, p - 1 + j, j as u32 + 1)?;
    }
    let (drafts, logits) = session.verify_round(k).await?;
    let vocab = session.model.config.vocab_size;
    // Row j's logits give the token at p + j + 1 after [next, d_1 .. d_j]; the first token
    // that is not a draft ends the round (or the bonus token after k accepted drafts).
    let mut emitted = Vec::with_capacity(k + 1);
    let mut hyp = recent.to_vec();
    for (j, row) in logits.chunks_exact(vocab).enumerate() {
        let (g, accepted) = match drafts.get(j) {
            Some(&d) => sampler.verify_draft(row, &hyp, d),
            None => (sampler.sample_after(row, &hyp), false),
        };
        emitted.push(g);
        hyp.push(g);
        if !accepted {
            break;
        }
    }
    session.count_round(k, emitted.len() - 1);
    Ok(emitted)
}

/// Keeps the first `kept.len()` (≥ 1) tokens a round starting at position `p` emitted (all,
/// or those before a stop): the main caches keep `p .. p + kept.len()` (`next` and the kept
/// tokens but the last), and the MTP layer runs over those rows, rewriting its caches where
/// the drafts wrote, its last row drafting the next round's d_1 (not waited for).
pub(crate) fn speculative_keep(session: &mut Session, p: usize, kept: &[u32]) -> Result<()> {
    session.truncate(p + kept.len());
    session.mtp_pass(kept, p)
}

/// Generation with the token chosen on the GPU, one step ahead of the host: step `n + 1`
/// is queued (reading step `n`'s token where the GPU left it) before step `n`'s token is
/// read back, so the GPU never waits for the host, and only 4 bytes come back per token.
/// The GPU applies the sampler's rules and the host's draws ([`Pick`]). When generation
/// stops at a token whose step was already queued, that step is rolled back (and its draw
/// returned to the sampler), so the session and the sampler end as on the host path.
async fn pipelined(
    session: &mut Session,
    history: &[u32],
    prompt: &[u32],
    max_tokens: usize,
    sampler: &mut Sampler,
    eos: &[u32],
    mut on_event: impl FnMut(Event) -> bool,
) -> Result<(Vec<u32>, Stop)> {
    let p = sampler.params.clone();
    let penalty = p.repeat_penalty != 1.0 && p.repeat_last_n > 0;
    let n = if penalty { p.repeat_last_n } else { 0 };
    // The last `n` known tokens (history, prompt, then the output read so far).
    let mut recent: Vec<u32> = history[history.len().saturating_sub(n)..].to_vec();
    recent.extend_from_slice(&prompt[prompt.len().saturating_sub(n)..]);
    let mut out = Vec::new();
    let mut done = 0;
    let chunks = prompt.len().div_ceil(session.chunk.max(1));
    let mut drew = false;
    for (i, part) in prompt.chunks(session.chunk.max(1)).enumerate() {
        if i + 1 == chunks {
            let window = &recent[recent.len().saturating_sub(n)..];
            let (how, d) = choose(sampler, &p, penalty, window, false);
            drew = d;
            session.forward_pick(part, Some((0, &how)))?;
        } else {
            session.forward_pick(part, None)?;
        }
        done += part.len();
        if !on_event(Event::Prefill {
            done,
            total: prompt.len(),
        }) {
            if drew {
                sampler.undraw();
            }
            return Ok((out, Stop::Callback));
        }
    }
    let mut slot = 0;
    loop {
        // The step that consumes the token about to be read, queued first when it will be
        // needed unless the token stops generation. Its window is the last n - 1 known
        // tokens and that token.
        let ahead = out.len() + 1 < max_tokens && session.pos < session.max_ctx();
        let mut drew = false;
        if ahead {
            let window = &recent[recent.len().saturating_sub(n.saturating_sub(1))..];
            let (how, d) = choose(sampler, &p, penalty, window, true);
            drew = d;
            session.step_pick(1 - slot, &how)?;
        }
        let next = session.picked_token(slot).await?;
        out.push(next);
        if penalty {
            recent.push(next);
            keep_last(&mut recent, n);
        }
        // The checks see the session as it was before the step queued ahead.
        let pos = session.pos - usize::from(ahead);
        if let Some(stop) = stop_after(&out, &mut on_event, eos, max_tokens, pos, session.max_ctx())
        {
            session.truncate(pos);
            if drew {
                sampler.undraw();
            }
            return Ok((out, stop));
        }
        slot = 1 - slot;
    }
}

/// The GPU pick for `p` with the penalty window `window` (+ the previous pick when `prev`),
/// drawing the sampler's next number when it samples; returns whether it drew.
fn choose<'w>(
    sampler: &mut Sampler,
    p: &SamplingParams,
    penalty: bool,
    window: &'w [u32],
    prev: bool,
) -> (Pick<'w>, bool) {
    match (p.is_greedy(), penalty) {
        (true, false) => (Pick::Argmax, false),
        (true, true) => (
            Pick::PenalizedArgmax {
                penalty: p.repeat_penalty,
                window,
                prev,
            },
            false,
        ),
        (false, _) => {
            // f32 below 1, as the host's f64 draw is.
            let r = (sampler.draw() as f32).min(1.0 - f32::EPSILON / 2.0);
            let s = crate::kernels::sample::Sampling {
                temperature: p.temperature,
                top_p: p.top_p,
                top_k: p.top_k as u32,
                penalty: if penalty { p.repeat_penalty } else { 1.0 },
                r,
            };
            (Pick::Sample { s, window, prev }, true)
        }
    }
}

/// Cuts generated text at the first of a set of stop strings, holding back any tail that
/// could still become one (so a stop string split across tokens is never shown).
#[derive(Debug, Clone, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    held: String,
    hit: bool,
}

impl StopStrings {
    /// Empty strings are ignored.
    pub fn new(stops: impl IntoIterator<Item = String>) -> StopStrings {
        StopStrings {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
            hit: false,
        }
    }

    /// Whether a stop string has been seen (everything after it is dropped).
    pub fn hit(&self) -> bool {
        self.hit
    }

    /// Feeds the next piece of text; returns the text that is now safe to show: all of it but
    /// a tail that is the start of a stop string, and nothing from a stop string on.
    pub fn push(&mut self, text: &str) -> String {
        if self.hit {
            return String::new();
        }
        self.held.push_str(text);
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(at) = first {
            self.hit = true;
            let out = self.held[..at].to_string();
            self.held.clear();
            return out;
        }
        let keep = partial_suffix(&self.held, &self.stops);
        let out = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        out
    }

    /// The held-back tail, once no more text comes.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// Length of the longest suffix of `text` that is a proper prefix of one of `needles` (and
/// starts on a character boundary).
pub(crate) fn partial_suffix<S: AsRef<str>>(text: &str, needles: &[S]) -> usize {
    let longest = needles.iter().map(|n| n.as_ref().len()).max().unwrap_or(0);
    let mut best = 0;
    for start in (text.len().saturating_sub(longest.saturating_sub(1))..text.len()).rev() {
        if !text.is_char_boundary(start) {
            continue;
        }
        let tail = &text[start..];
        if needles
            .iter()
            .any(|n| n.as_ref().len() > tail.len() && n.as_ref().starts_with(tail))
        {
            best = tail.len();
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_first_maximum() {
        let mut s = Sampler::new(SamplingParams::default());
        assert_eq!(s.sample(&[0.0, 3.0, 1.0, 3.0]), 1);
        assert_eq!(argmax(&[f32::NAN, -1.0, -2.0]), 1);
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_respects_top_k() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let p = SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 3,
            seed: 42,
            ..Default::default()
        };
        let draw = |p: &SamplingParams| {
            let mut s = Sampler::new(p.clone());
            (0..200).map(|_| s.sample(&logits)).collect::<Vec<u32>>()
        };
        let a = draw(&p);
        assert_eq!(a, draw(&p), "same seed, same tokens");
        let mut top3: Vec<u32> = (0..50).collect();
        top3.sort_by(|x, y| logits[*y as usize].total_cmp(&logits[*x as usize]));
        top3.truncate(3);
        assert!(
            a.iter().all(|t| top3.contains(t)),
            "only the 3 most likely tokens"
        );
        assert!(
            top3.iter().all(|t| a.contains(t)),
            "all of them drawn over 200 tries"
        );
        let other = draw(&SamplingParams {
            seed: 43,
            ..p.clone()
        });
        assert_ne!(a, other, "another seed, other tokens");
    }

    #[test]
    fn top_p_keeps_the_nucleus() {
        // One token holds ~88% of the mass: top_p 0.5 keeps only it.
        let logits = [5.0, 3.0, 0.0, 0.0];
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_p: 0.5,
            top_k: 0,
            seed: 1,
            ..Default::default()
        });
        assert!((0..100).all(|_| s.sample(&logits) == 0));
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            seed: 1,
            ..Default::default()
        });
        assert!((0..400).any(|_| s.sample(&logits) != 0));
    }

    #[test]
    fn repeat_penalty_pushes_seen_tokens_down() {
        let mut l = vec![2.0, -1.0, 3.0, 0.5];
        apply_repeat_penalty(&mut l, &[0, 1, 0, 99], 2.0);
        assert_eq!(
            l,
            vec![1.0, -2.0, 3.0, 0.5],
            "each seen token once; id 99 ignored"
        );
        // Greedy picks token 0 without the penalty and token 2 with it, but only when 0 is
        // inside the last `repeat_last_n` tokens.
        let logits = [3.0, 0.0, 2.0];
        let params = SamplingParams {
            repeat_penalty: 2.0,
            repeat_last_n: 2,
            ..Default::default()
        };
        let mut s = Sampler::new(params.clone());
        assert_eq!(s.sample_after(&logits, &[]), 0);
        assert_eq!(s.sample_after(&logits, &[1, 0]), 2);
        assert_eq!(
            s.sample_after(&logits, &[0, 1, 1]),
            0,
            "0 is out of the window"
        );
        let mut off = Sampler::new(SamplingParams {
            repeat_penalty: 1.0,
            ..params
        });
        assert_eq!(off.sample_after(&logits, &[0, 0]), 0);
    }

    #[test]
    fn min_p_and_count_penalties() {
        // min_p 0.2 at temperature 1: tokens below 0.2 × the top probability never come.
        let logits = [
            2.0,
            2.0 + 0.3f32.ln(),
            2.0 + 0.1f32.ln(),
            2.0 + 0.25f32.ln(),
        ];
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            min_p: 0.2,
            seed: 9,
            ..Default::default()
        });
        let drawn: Vec<u32> = (0..400).map(|_| s.sample(&logits)).collect();
        assert!(!drawn.contains(&2), "0.1 < 0.2 is dropped");
        for t in [0, 1, 3] {
            assert!(drawn.contains(&t), "{t} stays");
        }
        assert!(!s.gpu_can_pick(), "min-p samples on the host");

        let mut l = vec![1.0, 1.0, 1.0];
        apply_count_penalties(&mut l, &[0, 0, 1, 7], 0.5, 0.25);
        assert_eq!(
            l,
            vec![0.0, 0.25, 1.0],
            "presence once, frequency per time seen"
        );
        // Greedy with a presence penalty moves off a seen token, only inside the window.
        let p = SamplingParams {
            presence_penalty: 2.0,
            repeat_last_n: 2,
            ..Default::default()
        };
        let mut s = Sampler::new(p.clone());
        assert!(!s.gpu_can_pick(), "count penalties run on the host");
        assert_eq!(s.sample_after(&[3.0, 0.0, 2.0], &[0]), 2);
        assert_eq!(s.sample_after(&[3.0, 0.0, 2.0], &[0, 1, 1]), 0);
        let off = Sampler::new(SamplingParams {
            repeat_last_n: 0,
            ..p
        });
        assert!(off.gpu_can_pick(), "no window, no penalty: the GPU picks");
    }

    #[test]
    fn stop_strings_cut_and_hold_back_partial_matches() {
        let mut s = StopStrings::new(["\n\nUser:".to_string(), "END".to_string(), String::new()]);
        assert_eq!(s.push("Hello"), "Hello");
        assert_eq!(s.push(" wor"), " wor");
        assert_eq!(
            s.push("ld\n"),
            "ld",
            "a newline could start the stop string"
        );
        assert_eq!(s.push("\nUs"), "");
        assert!(!s.hit());
        assert_eq!(s.push("er: hi"), "");
        assert!(s.hit());
        assert_eq!(s.push("more"), "", "nothing after a stop");
        assert_eq!(s.finish(), "");

        let mut s = StopStrings::new(["END".to_string()]);
        assert_eq!(s.push("the E"), "the ");
        assert_eq!(s.push("gg"), "Egg", "the held E was not a stop after all");
        assert_eq!(s.push("...EN"), "...");
        assert_eq!(s.finish(), "EN", "held text comes out at the end");
        let mut s = StopStrings::new(["é!".to_string()]);
        assert_eq!(s.push("café"), "caf");
        assert_eq!(s.push("!x"), "");
        assert!(s.hit());
        let mut none = StopStrings::new(Vec::new());
        assert_eq!(none.push("anything"), "anything");
    }
}
