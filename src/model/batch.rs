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
use crate::kernels::{sample, View};

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
        let room = first.session.logit_room();
        if n > room {
            return Err(Error::msg(format!(
                "a batched step of {n} sessions: the scratch holds the logits of {room} rows"
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
        lead.head(&mut rec, (t, false), t, None)?;
        let vocab = model.config.vocab_size as u32;
        let logits = View::rows(&lead.s.logits, vocab);
        // Greedy rows all: picked in one pass into the lead's ids (row b's at b; the step
        // has read its tokens), each then copied to its session's. Else (or past the rows
        // one pass takes) row by row.
        let greedy =
            n > 1 && t <= sample::MAX_PARTS && rows.iter().all(|r| matches!(r.pick, Pick::Argmax));
        if greedy {
            let out = lead.s.next_token();
            sample::argmax_rows(&mut rec, logits, t, vocab, out, &lead.s.sample);
        }
        for (b, r) in rows.iter().enumerate() {
            let s = &r.session.s;
            if !greedy {
                lead.record_pick(&mut rec, logits.row(b as u32), &r.pick, s.next_token())?;
            } else if b > 0 {
                rec.copy(&lead.s.ids, 4 * b as u64, &s.ids, 0, 4);
            }
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

    /// Throwaway batched steps of every session of `sessions` (greedy picks), run only so
    /// that the pipelines of a step of that many rows are compiled: the first step of each
    /// width compiles them otherwise, a stall in the middle of a request. Two steps: one at
    /// the sessions' positions, and, where their context reaches past the indexer's top-k,
    /// one there (the indexer's scores and top-k run only past it, every position is
    /// selected before). The sessions are left as they were: a step writes each one's
    /// caches at a position past what it holds (rows a later token overwrites before any
    /// step reads them, as after [`Session::truncate`]), its picks overwrite the token each
    /// session's next step reads on the GPU, which is saved first and written back after,
    /// and the positions are rolled back. Refused while a picked token waits to be read (a
    /// step would overwrite its pick slot); otherwise the conditions of
    /// [`Session::step_batch`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn warm_batch(sessions: &mut [Session]) -> Result<()> {
        let Some(first) = sessions.first() else {
            return Ok(());
        };
        if sessions
            .iter()
            .any(|s| s.pending.iter().any(Option::is_some))
        {
            return Err(Error::msg(
                "a throwaway batched step while a picked token waits to be read",
            ));
        }
        let model = first.model.clone();
        let gpu = &*model.gpu;
        let saved = gpu.buffer(4 * sessions.len() as u64, "warm-up ids")?;
        let mut rec = gpu.recorder();
        for (b, s) in sessions.iter().enumerate() {
            rec.copy(&s.s.ids, 0, &saved, 4 * b as u64, 4);
        }
        drop(rec);
        let pos: Vec<usize> = sessions.iter().map(|s| s.pos).collect();
        // Past the indexer's top-k: position `topk` has topk + 1 keys (a dense session's
        // top-k is its whole context, so it never gets there).
        let indexed = sessions.iter().all(|s| s.topk < s.max_ctx());
        let mut stepped = Ok(());
        for past_topk in [false, true] {
            if past_topk {
                if !indexed {
                    break;
                }
                for s in sessions.iter_mut() {
                    s.pos = s.pos.max(s.topk);
                }
            }
            let mut rows: Vec<BatchRow> = sessions
                .iter_mut()
                .map(|session| BatchRow {
                    session,
                    slot: 0,
                    pick: Pick::Argmax,
                })
                .collect();
            stepped = Session::step_batch(&mut rows);
            drop(rows);
            for (s, &p) in sessions.iter_mut().zip(&pos) {
                s.pos = p;
            }
            if stepped.is_err() {
                break;
            }
        }
        // Restored whether or not the steps ran (a failed one may have recorded part).
        let mut rec = gpu.recorder();
        for (b, s) in sessions.iter().enumerate() {
            rec.copy(&saved, 4 * b as u64, &s.s.ids, 0, 4);
        }
        rec.finish()?;
        // The picks were waited for with the rest: nothing to read.
        for s in sessions.iter_mut() {
            s.pending = [None, None];
        }
        stepped
    }
}
