//! The host's token sampler: temperature, top-k, top-p and the repetition penalty, with a
//! seeded generator. It is the rule the GPU pickers (`crate::kernels::sample`) follow and
//! are tested against, and what picks the tokens when the GPU does not.

#[derive(Debug, Clone)]
pub struct SamplingParams {
    /// 0 (or below) is greedy.
    pub temperature: f32,
    /// Nucleus sampling mass; 1 keeps everything.
    pub top_p: f32,
    /// Keep only the `top_k` most likely tokens; 0 keeps all.
    pub top_k: usize,
    pub seed: u64,
    /// Repetition penalty as in llama.cpp / Ollama (`repeat_penalty`): the logit of every token
    /// seen in the last `repeat_last_n` tokens is divided by it when positive and multiplied by
    /// it when negative, before greedy or sampled selection. 1 turns it off.
    pub repeat_penalty: f32,
    /// How many recent tokens (prompt included) the penalties look at.
    pub repeat_last_n: usize,
    /// Drop tokens whose probability is below `min_p` times the most likely token's (before
    /// the temperature, as llama.cpp does); 0 turns it off.
    pub min_p: f32,
    /// Subtracted once from the logit of every token seen in the last `repeat_last_n` tokens
    /// (OpenAI's `presence_penalty`, over llama.cpp's window); 0 turns it off.
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time it was seen in that window (OpenAI's
    /// `frequency_penalty`); 0 turns it off.
    pub frequency_penalty: f32,
}

impl SamplingParams {
    /// Whether every token is the argmax (temperature 0 or below, or top-k 1).
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }

    /// Whether any penalty changes the logits (each needs the recent tokens).
    pub fn penalizes(&self) -> bool {
        self.repeat_last_n > 0
            && (self.repeat_penalty != 1.0
                || self.presence_penalty != 0.0
                || self.frequency_penalty != 0.0)
    }
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            seed: 0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            min_p: 0.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
        }
    }
}

/// Picks the next token from logits. Greedy takes the first maximum (lowest id), as
/// `torch.argmax` does.
pub struct Sampler {
    pub params: SamplingParams,
    state: u64,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Sampler {
        let state = params.seed.wrapping_mul(0x9E3779B97F4A7C15) ^ 0xD1B54A32D192ED03;
        Sampler {
            params,
            state: state | 1,
        }
    }

    fn uniform(&mut self) -> f64 {
        // splitmix64
        self.state = self.state.wrapping_add(0x9E3779B97F4A7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The next token after the tokens `recent` (the context so far, oldest first; only the
    /// last `repeat_last_n` matter), with the repetition penalty applied to `logits`.
    pub fn sample_after(&mut self, logits: &[f32], recent: &[u32]) -> u32 {
        let l = self.penalized(logits, recent);
        self.sample(&l)
    }

    /// `logits` with the penalties applied for the tokens `recent` (their last
    /// `repeat_last_n`); borrowed as they are where no penalty applies.
    fn penalized<'a>(&self, logits: &'a [f32], recent: &[u32]) -> std::borrow::Cow<'a, [f32]> {
        let p = &self.params;
        if !p.penalizes() || recent.is_empty() {
            return logits.into();
        }
        let mut l = logits.to_vec();
        let window = &recent[recent.len().saturating_sub(p.repeat_last_n)..];
        apply_repeat_penalty(&mut l, window, p.repeat_penalty);
        apply_count_penalties(&mut l, window, p.presence_penalty, p.frequency_penalty);
        l.into()
    }

    /// The token after `recent` given a draft `d` for it (see [`accept_draft`]): greedy
    /// takes the argmax, accepted when it is `d`; sampling accepts `d` with probability p(d),
    /// else draws from p without `d`. Either way the token has the distribution
    /// [`Sampler::sample_after`] draws from. Returns the token and whether it is `d`.
    pub fn verify_draft(&mut self, logits: &[f32], recent: &[u32], d: u32) -> (u32, bool) {
        let l = self.penalized(logits, recent);
        let p = &self.params;
        let dist = if p.is_greedy() {
            Vec::new()
        } else {
            distribution(p, &l)
        };
        if dist.is_empty() {
            let g = argmax(&l);
            return (g, g == d);
        }
        let u = self.uniform();
        let r = self.uniform();
        accept_draft(&dist, d, u, r)
    }

    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let params = self.params.clone();
        sample_logits(&params, logits, &mut || self.uniform())
    }

    /// The next uniform draw in [0, 1) (what [`Sampler::sample`] would use for its next
    /// sampled token).
    pub fn draw(&mut self) -> f64 {
        self.uniform()
    }

    /// Takes back the last draw: the next one repeats it (for a step that was queued ahead
    /// and then not used).
    pub fn undraw(&mut self) {
        self.state = self.state.wrapping_sub(0x9E3779B97F4A7C15);
    }
}

/// [`Sampler::sample`] with `draw` giving its uniform (called once, and only when a token is
/// sampled rather than the argmax taken).
pub fn sample_logits(p: &SamplingParams, logits: &[f32], draw: &mut dyn FnMut() -> f64) -> u32 {
    if p.is_greedy() {
        return argmax(logits);
    }
    let dist = distribution(p, logits);
    if dist.is_empty() {
        return argmax(logits);
    }
    pick(&dist, draw())
}

/// The tokens `p` samples from and their probabilities (summing to 1, most likely first):
/// temperature, then top-k, min-p and top-p. Empty when no logit is finite.
pub fn distribution(p: &SamplingParams, logits: &[f32]) -> Vec<(u32, f64)> {
    let mut cand: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .filter(|(_, l)| l.is_finite())
        .map(|(i, l)| (i as u32, *l / p.temperature))
        .collect();
    if cand.is_empty() {
        return Vec::new();
    }
    cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    if p.top_k > 0 && cand.len() > p.top_k {
        cand.truncate(p.top_k);
    }
    if p.min_p > 0.0 {
        // p_i >= min_p * p_max at temperature 1, i.e. l_i >= l_max + ln(min_p), on the
        // logits the temperature has divided.
        let floor = cand[0].1 + (p.min_p as f64).ln() as f32 / p.temperature;
        let keep = cand.iter().take_while(|(_, l)| *l >= floor).count().max(1);
        cand.truncate(keep);
    }
    let m = cand[0].1;
    let mut probs: Vec<f64> = cand.iter().map(|(_, l)| ((l - m) as f64).exp()).collect();
    let total: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|x| *x /= total);
    if p.top_p < 1.0 {
        let mut acc = 0.0;
        let mut keep = probs.len();
        for (i, x) in probs.iter().enumerate() {
            acc += x;
            if acc >= p.top_p as f64 {
                keep = i + 1;
                break;
            }
        }
        probs.truncate(keep);
        let t: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= t);
    }
    cand.iter()
        .zip(probs)
        .map(|((id, _), q)| (*id, q))
        .collect()
}

/// The token of `dist` that the uniform draw `r` in [0, 1) lands on (inverse CDF, in the
/// distribution's order).
fn pick(dist: &[(u32, f64)], mut r: f64) -> u32 {
    for (id, q) in dist {
        if r < *q {
            return *id;
        }
        r -= q;
    }
    dist[dist.len() - 1].0
}

/// Speculative sampling's rule for a draft token `d` proposed by a greedy drafter (whose
/// distribution is one-hot on `d`) against the target distribution `dist`: accepted when
/// the draw `u` is below p(d); else the token that `r` picks from p with `d` removed and
/// the rest renormalized, i.e. from norm(max(0, p - onehot(d))). Either way the token has
/// p's distribution: P(d) = p(d), and P(x) = (1 - p(d)) · p(x) / (1 - p(d)) for x ≠ d
/// (Leviathan et al. 2023; Chen et al. 2023). Returns the token and whether it is `d`.
pub fn accept_draft(dist: &[(u32, f64)], d: u32, u: f64, r: f64) -> (u32, bool) {
    let pd = dist
        .iter()
        .find(|(id, _)| *id == d)
        .map_or(0.0, |(_, q)| *q);
    if u < pd {
        return (d, true);
    }
    let rest: Vec<(u32, f64)> = dist
        .iter()
        .filter(|(id, _)| *id != d)
        .map(|(id, q)| (*id, q / (1.0 - pd)))
        .collect();
    if rest.is_empty() {
        // p(d) = 1 up to rounding: nothing else can be drawn.
        return (d, true);
    }
    (pick(&rest, r), false)
}

/// Divides the positive logits of the tokens in `seen` by `penalty` and multiplies the negative
/// ones by it (each token once, however often it was seen), as llama.cpp and transformers'
/// `RepetitionPenaltyLogitsProcessor` do. Ids outside the vocabulary are ignored.
pub fn apply_repeat_penalty(logits: &mut [f32], seen: &[u32], penalty: f32) {
    if penalty == 1.0 || penalty <= 0.0 {
        return;
    }
    let mut done = std::collections::HashSet::with_capacity(seen.len());
    for &t in seen {
        if !done.insert(t) {
            continue;
        }
        if let Some(l) = logits.get_mut(t as usize) {
            *l = if *l > 0.0 { *l / penalty } else { *l * penalty };
        }
    }
}

/// OpenAI's presence and frequency penalties over the tokens in `seen`: a token's logit loses
/// `presence` once if it was seen and `frequency` per time it was seen. Ids outside the
/// vocabulary are ignored.
pub fn apply_count_penalties(logits: &mut [f32], seen: &[u32], presence: f32, frequency: f32) {
    if presence == 0.0 && frequency == 0.0 {
        return;
    }
    let mut counts = std::collections::HashMap::with_capacity(seen.len());
    for &t in seen {
        *counts.entry(t).or_insert(0u32) += 1;
    }
    for (t, n) in counts {
        if let Some(l) = logits.get_mut(t as usize) {
            *l -= presence + frequency * n as f32;
        }
    }
}

/// The index of the largest value: the lowest among equal maxima, NaN skipped (0 when all
/// are NaN), as `torch.argmax` picks.
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] || (v[best].is_nan() && !x.is_nan()) {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> SamplingParams {
        SamplingParams {
            temperature: 0.7,
            top_p: 0.95,
            top_k: 5,
            seed: 11,
            ..Default::default()
        }
    }

    const LOGITS: [f32; 8] = [1.0, 2.5, 0.3, 2.2, -1.0, 1.9, 0.0, 2.4];

    #[test]
    fn accept_draft_on_fixed_draws() {
        let dist = distribution(&params(), &LOGITS);
        let p = |id: u32| dist.iter().find(|(i, _)| *i == id).map_or(0.0, |(_, q)| *q);
        let d = 3;
        // Accepted exactly when the first draw is below p(d).
        for u in [0.0, p(d) * 0.999, p(d), p(d) + 1e-6, 0.999] {
            let (tok, ok) = accept_draft(&dist, d, u, 0.5);
            assert_eq!(ok, u < p(d), "u {u}, p(d) {}", p(d));
            assert_eq!(ok, tok == d);
        }
        // Rejected: the second draw walks p without d, renormalized.
        let rest: Vec<(u32, f64)> = dist.iter().filter(|(i, _)| *i != d).copied().collect();
        let mut acc = 0.0;
        for (id, q) in &rest {
            let r = (acc + q / 2.0) / (1.0 - p(d));
            assert_eq!(accept_draft(&dist, d, 0.999, r), (*id, false), "r {r}");
            acc += q;
        }
        // A draft outside the distribution (cut by top-k) is never accepted.
        assert!(!accept_draft(&dist, 4, 0.0, 0.3).1);
    }

    #[test]
    fn verified_drafts_keep_the_sampling_distribution() {
        // Whatever the draft, the token verify_draft returns is distributed as sample_after's.
        let dist = distribution(&params(), &LOGITS);
        let n = 40_000;
        for d in [1u32, 3, 6] {
            let mut s = Sampler::new(params());
            let mut counts = [0usize; 8];
            for _ in 0..n {
                counts[s.verify_draft(&LOGITS, &[], d).0 as usize] += 1;
            }
            for (id, q) in &dist {
                let f = counts[*id as usize] as f64 / n as f64;
                let sigma = (q * (1.0 - q) / n as f64).sqrt();
                assert!(
                    (f - q).abs() < 5.0 * sigma + 1e-9,
                    "draft {d}: token {id} at {f}, p {q}"
                );
            }
            let outside: usize = (0..8u32)
                .filter(|i| !dist.iter().any(|(j, _)| j == i))
                .map(|i| counts[i as usize])
                .sum();
            assert_eq!(
                outside, 0,
                "draft {d}: tokens outside top-k/top-p were drawn"
            );
        }
        // Greedy: the argmax, accepted when it is the draft.
        let mut g = Sampler::new(SamplingParams::default());
        assert_eq!(g.verify_draft(&LOGITS, &[], 1), (1, true));
        assert_eq!(g.verify_draft(&LOGITS, &[], 7), (1, false));
    }
}
