//! One decode step for several sessions at once: each session's next token is a row of one
//! forward, so every weight is read once for all of them (decode is bound by those reads,
//! and a batch of 8 costs little more than one row). The rows attend to their own caches:
//! the sessions are regions of one pool ([`crate::cache::Caches::pool`]) and each row says
//! where it sits ([`crate::kernels::Causal::places`]), so the attention kernels take all
//! rows in one dispatch too.
//!
//! The first session's scratch runs the step; each session's token comes from its own
//! `ids[0]` (where its previous pick left it) and its pick goes back there and to its pick
//! slot, so a session can go on alone ([`Session::step_pick`]) or in the next batch.

use super::pick::Pick;
use super::session::Session;
use crate::error::{Error, Result};
use crate::kernels::View;

/// A session's part of a batched step: the pick slot its token goes to and how it is picked.
pub struct BatchRow<'s, 'p> {
    pub session: &'s mut Session,
    pub slot: usize,
    pub pick: Pick<'p>,
}

impl Session {
    /// One decode step for every session of `rows` (see the module documentation), queued
    /// without waiting; read each token with [`Session::picked_token`]. The sessions must
    /// share a cache pool (one session may run alone), none may be full, and penalty
    /// windows are refused with more than one row (they would share one buffer).
    pub fn step_batch(rows: &mut [BatchRow]) -> Result<()> {
        let Some(first) = rows.first() else {
            return Ok(());
        };
        let n = rows.len();
        if n > first.session.chunk {
            return Err(Error::msg(format!(
                "a batched step of {n} sessions: the scratch holds {} rows",
                first.session.chunk
            )));
        }
        for r in rows.iter_mut() {
            let s = &mut *r.session;
            s.check_step()?;
            s.caches.reserve(&s.model.gpu, s.pos + 1)?;
        }
        let lead = &*rows[0].session;
        let apart = |s: &Session| !s.caches.same_pool(&lead.caches) || s.dense != lead.dense;
        if rows[1..].iter().any(|r| apart(r.session)) {
            return Err(Error::msg(
                "a batched step over sessions that do not share a cache pool",
            ));
        }
        let windowed = |p: &Pick| match p {
            Pick::Argmax => false,
            Pick::PenalizedArgmax { window, .. } | Pick::Sample { window, .. } => {
                !window.is_empty()
            }
        };
        if n > 1 && rows.iter().any(|r| windowed(&r.pick)) {
            return Err(Error::msg(
                "a batched step with repetition-penalty windows (pick those alone)",
            ));
        }
        let model = lead.model.clone();
        let gpu = &*model.gpu;
        let places: Vec<(usize, usize)> = rows
            .iter()
            .map(|r| (r.session.caches.lo(), r.session.pos))
            .collect();
        let span = lead.place_rows(&places);
        let t = n as u32;
        let mut rec = gpu.recorder();
        rec.cache_bind_groups(super::forward::caches_bind_groups(t));
        // Row b's token: session b's next input (row 0's is already there).
        for (b, r) in rows.iter().enumerate().skip(1) {
            rec.copy(&r.session.s.ids, 0, &lead.s.ids, 4 * b as u64, 4);
        }
        lead.layers(&mut rec, span)?;
        lead.head(&mut rec, t, t, None)?;
        let logits = View::rows(&lead.s.logits, model.config.vocab_size as u32);
        for (b, r) in rows.iter().enumerate() {
            let s = &r.session.s;
            lead.record_pick(&mut rec, logits.row(b as u32), &r.pick, s.next_token())?;
            rec.copy(&s.ids, 0, &s.picked[r.slot], 0, 4);
        }
        drop(rec);
        let done = gpu.last_submission();
        gpu.check()?;
        if let Some(off) = &model.offload {
            off.check_files()?;
        }
        for r in rows.iter_mut() {
            r.session.pending[r.slot] = done.clone();
            r.session.pos += 1;
        }
        Ok(())
    }
}
