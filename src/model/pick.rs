//! Picking the next token on the GPU, from the logits row the head left there: greedy, greedy
//! with the repetition penalty, or top-k / top-p sampling with the host sampler's own draw
//! (`crate::kernels::sample`). The token goes where the next step's embedding reads it, so
//! a decode step can be queued before the previous one's token is read back.

use super::session::Session;
use crate::error::Result;
use crate::gpu::Recorder;
use crate::kernels::sample::{self, TokenSlot, Window};
use crate::kernels::View;
use crate::sampling::Sampler;

/// How a step picks its token on the GPU (see [`Session::forward_pick`]).
#[derive(Clone, Copy, Debug)]
pub enum Pick<'a> {
    /// The argmax of the logits.
    Argmax,
    /// The argmax after the repetition penalty on the tokens of `window`, and on the token
    /// the previous step picked when `prev` (each token once).
    PenalizedArgmax {
        penalty: f32,
        window: &'a [u32],
        prev: bool,
    },
    /// Top-k / top-p sampling with the draw `s.r`, after the penalty as above.
    Sample {
        s: sample::Sampling,
        window: &'a [u32],
        prev: bool,
    },
}

impl Sampler {
    /// Whether the GPU can pick the tokens by these rules (greedy, or a top-k of at most
    /// [`sample::MAX_TOP_K`]; any top-p and repetition penalty): then generation runs a step
    /// ahead of the host. Sampling from the whole vocabulary (top-k 0), min-p and the
    /// presence / frequency penalties stay on the host.
    pub fn gpu_can_pick(&self) -> bool {
        let p = &self.params;
        let counts = p.presence_penalty != 0.0 || p.frequency_penalty != 0.0;
        let host_only = (counts && p.penalizes()) || (p.min_p > 0.0 && !p.is_greedy());
        !host_only && (p.is_greedy() || (1..=sample::MAX_TOP_K as usize).contains(&p.top_k))
    }
}

impl Session {
    /// Records `pick` over the logits row `last`; the token goes to `out` (a session's
    /// `ids[0]`: its next step's input, [`super::scratch::Scratch::next_token`]).
    pub(super) fn record_pick(
        &self,
        rec: &mut Recorder,
        last: View,
        pick: &Pick,
        out: TokenSlot,
    ) -> Result<()> {
        let s = &self.s;
        let gpu = &*self.model.gpu;
        let vocab = self.model.config.vocab_size as u32;
        // The penalty window, written ahead of the submission (queue order keeps the
        // previous step's reads of it first), for `run` to record with.
        let penalized = |w: &[u32], prev: bool, run: &mut dyn FnMut(&Window)| -> Result<()> {
            let buf = gpu.scratch("sample window", 4 * w.len().max(1) as u64)?;
            gpu.write(&buf, 0, bytemuck::cast_slice(w));
            run(&Window {
                buf: &buf,
                len: w.len() as u32,
                prev,
            });
            Ok(())
        };
        let sc = &s.sample;
        match *pick {
            Pick::Argmax => sample::argmax(rec, last, vocab, out, sc),
            Pick::PenalizedArgmax {
                penalty,
                window,
                prev,
            } => penalized(window, prev, &mut |win| {
                sample::argmax_penalized(rec, last, vocab, penalty, win, out, sc)
            })?,
            Pick::Sample {
                s: smp,
                window,
                prev,
            } => penalized(window, prev, &mut |win| {
                sample::sample(rec, last, vocab, &smp, win, out, sc)
            })?,
        }
        Ok(())
    }
}
