//! Token sampling and the generation loop.

use crate::error::Result;
use crate::model::Session;

#[derive(Debug, Clone)]
pub struct SamplingParams {
    /// 0 (or below) is greedy.
    pub temperature: f32,
    /// Nucleus sampling mass; 1 keeps everything.
    pub top_p: f32,
    /// Keep only the `top_k` most likely tokens; 0 keeps all.
    pub top_k: usize,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            seed: 0,
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

    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let p = &self.params;
        if p.temperature <= 0.0 || p.top_k == 1 {
            return argmax(logits);
        }
        let mut cand: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .filter(|(_, l)| l.is_finite())
            .map(|(i, l)| (i as u32, *l / p.temperature))
            .collect();
        if cand.is_empty() {
            return argmax(logits);
        }
        cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if p.top_k > 0 && cand.len() > p.top_k {
            cand.truncate(p.top_k);
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
            cand.truncate(keep);
            let t: f64 = probs.iter().sum();
            probs.iter_mut().for_each(|x| *x /= t);
        }
        let mut r = self.uniform();
        for (i, x) in probs.iter().enumerate() {
            if r < *x {
                return cand[i].0;
            }
            r -= x;
        }
        cand[cand.len() - 1].0
    }
}

pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] || (v[best].is_nan() && !x.is_nan()) {
            best = i;
        }
    }
    best as u32
}

/// Why generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    Eos,
    MaxTokens,
    ContextFull,
    Callback,
}

/// Prefill `prompt` (appended to whatever the session holds), then sample up to
/// `max_tokens` tokens. `on_token` sees each token as it is produced and may return false
/// to stop. Returns the generated tokens (an eos token is included) and why it stopped.
pub fn generate(
    session: &mut Session,
    prompt: &[u32],
    max_tokens: usize,
    sampler: &mut Sampler,
    eos: &[u32],
    mut on_token: impl FnMut(u32) -> bool,
) -> Result<(Vec<u32>, Stop)> {
    let mut out = Vec::new();
    if max_tokens == 0 {
        return Ok((out, Stop::MaxTokens));
    }
    let logits = session.forward(prompt, false)?;
    let mut next = sampler.sample(logits.last());
    loop {
        out.push(next);
        if !on_token(next) {
            return Ok((out, Stop::Callback));
        }
        if eos.contains(&next) {
            return Ok((out, Stop::Eos));
        }
        if out.len() >= max_tokens {
            return Ok((out, Stop::MaxTokens));
        }
        if session.pos >= session.max_ctx() {
            return Ok((out, Stop::ContextFull));
        }
        let logits = session.forward(&[next], false)?;
        next = sampler.sample(logits.last());
    }
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
        });
        assert!((0..100).all(|_| s.sample(&logits) == 0));
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            seed: 1,
        });
        assert!((0..400).any(|_| s.sample(&logits) != 0));
    }
}
