//! Speculative decoding with the model's own multi-token-prediction layer ([`Mtp`]).
//!
//! The MTP layer predicts the token after next: its row at position i is
//! `eh_proj · [enorm(embed(t_{i+1})) ; hnorm(h_i)]`, with `h_i` the main model's hidden row
//! after the final norm, then a full DSA MoE decoder layer with caches of its own,
//! `shared_head.norm` and the main LM head. One round, with the main model's caches holding
//! positions `0 .. P` and `next` (the token at P) chosen but not yet run:
//!
//! 1. draft: the MTP layer's last row gave `d_1`; each further draft runs the MTP layer on
//!    one row `(d_j, its own previous output after shared_head.norm)` at position `P - 1 + j`;
//! 2. verify: the main model runs `[next, d_1 .. d_k]` at `P .. P + k` in one chunk (the
//!    prefill path) and every row's logits come back;
//! 3. accept the longest prefix of drafts the main model agrees with, plus the main model's
//!    own token after it; the main caches roll back to what was accepted (`truncate`: rows
//!    past the position are overwritten later, never read);
//! 4. the MTP layer runs over the accepted rows (`(t_{i+1}, h_i)` for the verified positions),
//!    which rewrites its caches where the drafts wrote speculative rows, and its last row
//!    gives the next round's `d_1`.
//!
//! Greedy output is the main model's own: every emitted token is the main model's argmax
//! (under the sampler's penalties) given the tokens before it. Facts and their sources:
//! docs/MTP.md.

use super::forward::{caches_bind_groups, gemv};
use super::load::Mtp;
use super::session::{At, Input, Session};
use crate::error::{Error, Result};
use crate::gpu::{Recorder, Recording, Stopwatch};
use crate::kernels::sample::{self, TokenSlot};
use crate::kernels::{embed, norm, spec, View};

/// Drafts proposed and accepted so far in a session.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DraftStats {
    /// Verification rounds (one main-model forward each).
    pub rounds: u64,
    /// Draft tokens proposed and accepted.
    pub drafted: u64,
    pub accepted: u64,
    /// Host time spent recording and submitting the MTP layer's passes and the
    /// verifications, and waiting for a verification's results, in ms.
    pub ms_recording: f64,
    pub ms_waiting: f64,
    /// Rounds queued on the GPU by replaying an earlier round's recording
    /// ([`Session::gpu_round`]).
    pub replayed: u64,
}

impl DraftStats {
    /// Tokens per main-model forward: accepted drafts plus the main model's own token.
    pub fn mean_accepted_length(&self) -> f64 {
        if self.rounds == 0 {
            0.0
        } else {
            (self.accepted + self.rounds) as f64 / self.rounds as f64
        }
    }

    /// Adds another session's counts.
    pub fn add(&mut self, o: &DraftStats) {
        self.rounds += o.rounds;
        self.drafted += o.drafted;
        self.accepted += o.accepted;
        self.ms_recording += o.ms_recording;
        self.ms_waiting += o.ms_waiting;
        self.replayed += o.replayed;
    }

    /// One line for logs.
    pub fn line(&self) -> String {
        let per_round = |ms: f64| ms / self.rounds.max(1) as f64;
        format!(
            "drafts: {} of {} accepted ({:.0} %), {:.2} tokens per verification over {} rounds ({} replayed); per round {:.3} ms recording, {:.3} ms waiting for the GPU",
            self.accepted,
            self.drafted,
            100.0 * self.accepted as f64 / self.drafted.max(1) as f64,
            self.mean_accepted_length(),
            self.rounds,
            self.replayed,
            per_round(self.ms_recording),
            per_round(self.ms_waiting),
        )
    }
}

/// Read-back slots of [`GpuRounds`]: rounds queued and not yet read, at most.
const ROUND_SLOTS: usize = 3;

/// Greedy rounds queued without waiting for the host ([`Session::gpu_round`]): the state
/// the GPU keeps (`spec.wgsl`: the next round's position, the last round's, its accepted
/// drafts, and a log slot per queued round), every position's RoPE cos/sin rows (so the GPU
/// places a chunk's rows with the host's own values), and a mappable buffer per log slot.
pub(crate) struct GpuRounds {
    pub(crate) state: wgpu::Buffer,
    pub(crate) table: wgpu::Buffer,
    /// Floats of a cos/sin row, and the table's last position.
    pub(crate) dim: u32,
    pub(crate) last: u32,
    pub(crate) ring: Vec<wgpu::Buffer>,
    /// The submission that fills each log slot's read-back buffer, until it is read.
    queued: Vec<Option<wgpu::SubmissionIndex>>,
    /// Drafts a round.
    k: u32,
    /// Each log slot's last round as recorded, kept for replay ([`Session::gpu_round`]).
    kept: Vec<Option<KeptRound>>,
}

/// A GPU round's recording, and what it was recorded for: the bound on its first position
/// ([`round_bound`]) and the caches' generation (`Caches::generation`: the buffers its bind
/// groups name).
struct KeptRound {
    most: usize,
    generation: u64,
    recording: Recording,
}

/// Positions a GPU round's bound on its first position is rounded up to ([`round_bound`]).
const ROUND_BOUND_STEP: usize = 64;

/// The bound a GPU round is recorded for when its first position is at most `most`: `most`
/// rounded up to a multiple of [`ROUND_BOUND_STEP`] where the context (`max_ctx`, `k`
/// drafts) leaves room, else `most`. The kernels read the positions themselves from the
/// rounds' state and use the bound only to size their work, so any bound at or above the
/// position gives the same results; a shared one makes the rounds between two multiples
/// record the same dispatches, so each log slot records one of them and replays it for
/// the others.
fn round_bound(most: usize, k: usize, max_ctx: usize) -> usize {
    let up = most.next_multiple_of(ROUND_BOUND_STEP);
    up.min(max_ctx.saturating_sub(k + 1)).max(most)
}

/// Whether GPU rounds are replayed where they can be (`SPARSA_ROUND_REPLAY=0`: every round
/// recorded anew, a measurement aid).
fn replay_rounds() -> bool {
    crate::knobs::knob_on!("SPARSA_ROUND_REPLAY")
}

impl GpuRounds {
    /// Where the main model's picks after the verified rows go in `ids`: after `[next,
    /// d_1 .. d_k]`.
    pub(crate) fn picks(&self) -> u32 {
        self.k + 1
    }

    /// Where `spec::accept` writes the MTP pass's tokens in `ids`.
    pub(crate) fn mtp(&self) -> u32 {
        2 * self.k + 2
    }

    /// `ids` as `spec::accept` reads it.
    pub(crate) fn ids<'a>(&self, ids: &'a wgpu::Buffer) -> spec::RoundIds<'a> {
        spec::RoundIds {
            ids,
            k: self.k,
            picks: self.picks(),
            mtp: self.mtp(),
        }
    }

    /// Byte offset and length of log slot `slot` in the state.
    pub(crate) fn log_bytes(&self, slot: usize) -> (u64, u64) {
        let words = self.k as u64 + 2;
        (
            4 * (spec::log_word(self.k) as u64 + slot as u64 * words),
            4 * words,
        )
    }
}

impl Session {
    /// Draft `k` tokens per step with the model's MTP layer (0: off). Refused where the
    /// model runs none, or `k` leaves no room in a chunk.
    pub fn set_drafts(&mut self, k: usize) -> Result<()> {
        if k > 0 && self.model.weights.mtp.is_none() {
            return Err(Error::msg(format!(
                "--draft {k}: {} has no multi-token-prediction layer to draft with (num_nextn_predict_layers 0, or its tensors missing)",
                self.model.label
            )));
        }
        if k + 1 > self.logit_room() {
            return Err(Error::msg(format!(
                "--draft {k}: verifying {} positions at once exceeds the {} rows whose logits this session's scratch holds",
                k + 1,
                self.logit_room()
            )));
        }
        self.drafts = k;
        Ok(())
    }

    /// Compiles the pipelines decoding records, before the first token needs them: a decode
    /// step's chunk of one row; with drafts, the main model's chunk with its logits and the
    /// MTP layer, each at every row count a round takes (1 ..= drafts + 1: a verification's
    /// k + 1 rows, fewer near the end of a reply, and the MTP layer over the accepted rows)
    /// and, with `gpu_rounds`, a greedy round on the GPU. Each runs once at the current
    /// position, which is then restored with the draft statistics; rows past it are
    /// rewritten before they are read, and the next prompt sets the MTP layer's hidden row
    /// and first draft afresh. The indexer's scores and top-k run in these chunks though the
    /// context is short (`warm_indexer`): else they compiled when a reply first passed
    /// `index_topk` positions, in the middle of it.
    ///
    /// Without it, rounds compiled their variants as they first met each row count: on an
    /// H100 that cost the built-in model 0.5–1.1 ms a round averaged over 1,000 tokens, about
    /// as much as a round's own recording (BENCHMARKS.md, "2026-12-06 (fourth session)").
    /// The pipeline cache logs each compile at debug level.
    pub async fn warm_decode(&mut self, gpu_rounds: bool) -> Result<()> {
        let (pos, stats) = (self.pos, self.draft_stats);
        self.warm_indexer = true;
        let r = self.warm_chunks(gpu_rounds).await;
        self.warm_indexer = false;
        self.pos = pos;
        self.draft_stats = stats;
        r
    }

    /// [`Session::warm_decode`]'s chunks, at the current position.
    async fn warm_chunks(&mut self, gpu_rounds: bool) -> Result<()> {
        let pos = self.pos;
        let rows = (self.drafts + 1).min(self.max_ctx().saturating_sub(pos));
        let drafts = self.drafts > 0;
        for t in 1..=rows {
            self.chunk_forward(Input::Host(&vec![0; t]), t, None, drafts, false)?;
            self.pos = pos;
            if drafts {
                self.mtp_record(0, t, pos, 1)?;
            }
        }
        // With `gpu_rounds` (greedy sampling without penalties will queue rounds on the
        // GPU), one such round: its own kernels (places, picks, acceptance).
        if drafts && gpu_rounds && self.gpu_rounds_fit() && rows == self.drafts + 1 {
            self.begin_gpu_rounds(0)?;
            let slot = self.gpu_round(pos)?;
            self.read_gpu_round(slot).await?;
        }
        self.model.gpu.read_f32_async(&self.s.ids, 1, 1).await?;
        Ok(())
    }

    /// Draft tokens per step (0: no speculative decoding).
    pub fn drafts(&self) -> usize {
        self.drafts
    }

    /// What drafting did so far.
    pub fn draft_stats(&self) -> DraftStats {
        self.draft_stats
    }

    pub(crate) fn count_round(&mut self, drafted: usize, accepted: usize) {
        let s = &mut self.draft_stats;
        s.rounds += 1;
        s.drafted += drafted as u64;
        s.accepted += accepted as u64;
    }

    fn mtp(&self) -> &Mtp {
        self.model
            .weights
            .mtp
            .as_ref()
            .expect("drafting is only enabled with an MTP layer")
    }

    /// The MTP layer over the `t` tokens in `s.ids[at .. at + t]` (written by the host, or
    /// picked there by an earlier draft step on the GPU) at positions `pos0 ..`, paired with
    /// the hidden rows in `s.mtp_h` (row r with token r). The draft the last row predicts
    /// (the token at `pos0 + t + 1`) is picked on the GPU into `s.ids[dst]`, and that row's
    /// output after `shared_head.norm` stays in `s.mtp_h` row 0 for the next draft step.
    /// Submitted without waiting: a round's draft steps and its verification queue back to
    /// back, and the host reads the drafts once, with the verification's logits.
    pub(crate) fn mtp_record(&mut self, at: u32, t: usize, pos0: usize, dst: u32) -> Result<()> {
        self.mtp_at(at, t, At::Host(pos0), dst, None)
    }

    /// [`Session::mtp_record`] at `pos`; with `round` (a log slot), the MTP pass of a greedy
    /// round queued on the GPU ([`Session::gpu_round`]): it first picks the main model's
    /// token after each verified row and accepts the drafts that agree (`spec::accept`, which
    /// writes the pass's tokens at `at` and the round's tokens to the log slot), its last
    /// row is the last accepted one, and the log slot is copied out to be read back.
    fn mtp_at(&mut self, at: u32, t: usize, pos: At, dst: u32, round: Option<usize>) -> Result<()> {
        let start = Stopwatch::start();
        let model = self.model.clone();
        let gpu = &*model.gpu;
        self.caches.reserve(gpu, pos.most() + t)?;
        let mut rec = gpu.recorder();
        rec.cache_bind_groups(caches_bind_groups(t as u32));
        self.mtp_record_into(&mut rec, at, t, pos, dst, round)?;
        drop(rec);
        self.draft_stats.ms_recording += start.ms();
        gpu.check()
    }

    /// Records [`Session::mtp_at`]'s pass into `rec`; the caches must already hold its rows.
    fn mtp_record_into(
        &self,
        rec: &mut Recorder,
        at: u32,
        t: usize,
        pos: At,
        dst: u32,
        round: Option<usize>,
    ) -> Result<()> {
        let model = &self.model;
        let cfg = &model.config;
        let s = &self.s;
        let (hd, t) = (cfg.hidden_size as u32, t as u32);
        let vocab = cfg.vocab_size as u32;
        let rounds = round.map(|slot| {
            let r = self.rounds.as_ref().expect("a GPU round has its state");
            let logits = (View::rows(&s.logits, vocab), vocab);
            let ids = r.ids(&s.ids);
            spec::pick_and_accept(rec, &r.state, logits, ids, slot as u32, &s.sample);
            (r, slot)
        });
        let span = self.place(rec, pos, t as usize);
        let mtp = self.mtp();
        let h = View::rows(&s.h, hd);
        let hidden = View::rows(&s.mtp_h, hd);
        let cat = View::rows(&s.mtp_cat, 2 * hd);
        let eps = cfg.rms_norm_eps;
        let norms = embed::MtpNorms {
            enorm: &mtp.enorm,
            hnorm: &mtp.hnorm,
            eps,
            hidden,
        };
        embed::embed_mtp(rec, &model.weights.embed, (&s.ids, at, t), &norms, cat);
        gemv(rec, None, cat, &mtp.eh_proj, h, t);
        let i = cfg.num_hidden_layers;
        self.attention(rec, i, &mtp.layer, span);
        self.mlp(rec, i, &mtp.layer, t)?;
        // The last row after shared_head.norm: the next draft's hidden, and the LM head's
        // input. A GPU round's is its last accepted row, which the state names.
        match rounds {
            Some((r, _)) => {
                let x = (h, t);
                let sel = (&r.state, spec::ACCEPTED);
                norm::rms_norm_selected(rec, x, sel, &mtp.head_norm, hidden, hd, eps);
            }
            None => norm::rms_norm(rec, h.row(t - 1), &mtp.head_norm, hidden, 1, hd, eps),
        }
        let head = model.weights.head();
        let logits = View::rows(&s.logits, vocab);
        gemv(rec, None, hidden, head, logits, 1);
        let slot = TokenSlot {
            ids: &s.ids,
            index: dst,
        };
        sample::argmax(rec, logits, vocab, slot, &s.sample);
        if let Some((r, slot)) = rounds {
            let (off, bytes) = r.log_bytes(slot);
            rec.copy(&r.state, off, &r.ring[slot], 0, bytes);
        }
        Ok(())
    }

    /// The MTP layer over `tokens` (from the host) at positions `pos0 ..` after the hidden
    /// rows in `s.mtp_h`: a prompt chunk, or a round's verified rows. Its last row's draft
    /// goes to `ids[1]`, where the next round's first draft is read; not waited for.
    pub(crate) fn mtp_pass(&mut self, tokens: &[u32], pos0: usize) -> Result<()> {
        self.put_tokens(tokens);
        self.mtp_record(0, tokens.len(), pos0, 1)
    }

    /// One draft step from the host (the bench's timing): the MTP layer on `token` at `pos`
    /// after the hidden row in `s.mtp_h`; returns the draft.
    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) async fn mtp_step(&mut self, token: u32, pos: usize) -> Result<u32> {
        self.mtp_pass(&[token], pos)?;
        let id = self.model.gpu.read_f32_async(&self.s.ids, 1, 1).await?;
        Ok(id[0].to_bits())
    }

    /// Verifies the round `s.ids[0 .. k + 1]` = `[next, d_1 .. d_k]` (next written by the
    /// host, the drafts picked there by the draft steps): the main model's chunk at
    /// `self.pos`, keeping every row's hidden in `s.mtp_h`; returns the drafts and every
    /// row's logits, read back once it has run (the round's one wait for the GPU).
    pub(crate) async fn verify_round(&mut self, k: usize) -> Result<(Vec<u32>, Vec<f32>)> {
        let (gpu, vocab) = (self.model.gpu.clone(), self.model.config.vocab_size);
        if self.pos + k + 1 > self.max_ctx() {
            return Err(Error::msg(format!(
                "context full: verifying {} positions after {} cached tokens exceeds --ctx {}",
                k + 1,
                self.pos,
                self.max_ctx()
            )));
        }
        let start = Stopwatch::start();
        self.chunk_forward(Input::OnGpu(k + 1), k + 1, None, true, false)?;
        // Logits and drafts into one mappable buffer: one wait, one map.
        let logit_bytes = ((k + 1) * vocab * 4) as u64;
        let bytes = logit_bytes + 4 * k as u64;
        if self.verify_out.as_ref().is_none_or(|b| b.size() < bytes) {
            self.verify_out = Some(gpu.create_buffer(&wgpu::BufferDescriptor {
                label: Some("verification read-back"),
                size: bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }));
        }
        let out = self.verify_out.as_ref().expect("made above");
        let mut rec = gpu.recorder();
        rec.copy(&self.s.logits, 0, out, 0, logit_bytes);
        rec.copy(&self.s.ids, 4, out, logit_bytes, 4 * k as u64);
        drop(rec);
        self.draft_stats.ms_recording += start.ms();
        let waited = Stopwatch::start();
        let b = gpu.read_mapped_async(out, bytes, None).await?;
        self.draft_stats.ms_waiting += waited.ms();
        let (logits, drafts) = b.split_at(logit_bytes as usize);
        Ok((
            bytemuck::pod_collect_to_vec(drafts),
            bytemuck::pod_collect_to_vec(logits),
        ))
    }

    /// Whether greedy rounds can be queued on the GPU here: `ids` holds a round's drafts,
    /// picks and MTP tokens.
    pub(crate) fn gpu_rounds_fit(&self) -> bool {
        let k = self.drafts;
        k > 0 && 3 * k + 3 <= self.chunk && k < self.logit_room()
    }

    /// Starts greedy rounds on the GPU at `self.pos`, with `next` (chosen, not yet run) and
    /// d_1 in `ids[1]`, as a host round (`generate::speculative_round`) starts: the state, the table
    /// and the read-back slots are made on first use (again when the drafts change); rounds
    /// an earlier reply left queued and unread give up their slots.
    pub(crate) fn begin_gpu_rounds(&mut self, next: u32) -> Result<()> {
        let gpu = self.model.gpu.clone();
        let k = self.drafts as u32;
        if self.rounds.as_ref().is_none_or(|r| r.k != k) {
            self.rounds = None;
            let words = spec::state_words(k, ROUND_SLOTS as u32);
            let state = gpu.buffer_from(&vec![0u32; words as usize], "speculative state")?;
            let table = self.rope.cos_sin(0..self.max_ctx());
            let dim = (table.len() / self.max_ctx()) as u32;
            let table = gpu.buffer_from(&table, "RoPE cos/sin of every position")?;
            let ring = (0..ROUND_SLOTS)
                .map(|_| {
                    gpu.create_buffer(&wgpu::BufferDescriptor {
                        label: Some("speculative round read-back"),
                        size: 4 * (k as u64 + 2),
                        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                        mapped_at_creation: false,
                    })
                })
                .collect();
            self.rounds = Some(GpuRounds {
                state,
                table,
                dim,
                last: self.max_ctx() as u32 - 1,
                ring,
                queued: vec![None; ROUND_SLOTS],
                k,
                kept: (0..ROUND_SLOTS).map(|_| None).collect(),
            });
        }
        // The scratch and the caches may have been replaced since the last rounds.
        self.drop_round_recordings();
        let r = self.rounds.as_mut().expect("made above");
        r.queued.fill(None);
        gpu.write(&r.state, 0, bytemuck::cast_slice(&[self.pos as u32]));
        self.put_tokens(&[next]);
        gpu.check()
    }

    /// Queues one greedy round on the GPU, whose first position the state holds (at most
    /// `most`): draft steps 2 ..= k, the verification of `[next, d_1 .. d_k]`, then the MTP
    /// pass that picks the main model's tokens, accepts the drafts that agree, advances the
    /// state and drafts the next round's d_1 ([`Session::mtp_at`]). Its tokens go to a free
    /// log slot, which it returns for [`Session::read_gpu_round`]. Needs
    /// [`Session::begin_gpu_rounds`]; the caller keeps `most + k + 1` within the context.
    ///
    /// A round's dispatches depend only on its log slot and the bound on its position
    /// ([`round_bound`]), so the slot's last recording is replayed while both (and the
    /// caches' buffers) are the same: the host then submits the kept commands instead of
    /// walking the model again. Not with streamed or CPU experts, whose rounds depend on
    /// what the host uploads.
    pub(crate) fn gpu_round(&mut self, most: usize) -> Result<usize> {
        let k = self.drafts;
        let r = self.rounds.as_ref().expect("begun");
        let slot = r.queued.iter().position(Option::is_none).ok_or_else(|| {
            Error::msg(format!(
                "all {ROUND_SLOTS} speculative read-back slots hold rounds not yet read"
            ))
        })?;
        let replay = replay_rounds() && self.model.offload.is_none();
        let most = if replay {
            round_bound(most, k, self.max_ctx())
        } else {
            most
        };
        let on = |offset: usize| At::Gpu {
            offset: offset as u32,
            most: most + offset,
        };
        let start = Stopwatch::start();
        let model = self.model.clone();
        let gpu = &*model.gpu;
        self.check_logit_room(k + 1, k + 1)?;
        // Every chunk of the round within the caches before any is recorded (the
        // verification reaches furthest), and the whole round in one submission: the GPU
        // runs the round before it meanwhile, so an early submission buys nothing (the
        // verification alone in one: 1,991 → 2,046 / 2,052 tok/s for the built-in model's
        // --draft 3 on an H100, BENCHMARKS.md, "2026-12-06 (sixth session)").
        if !self.caches.holds(most + k + 1) {
            // The caches grow into new buffers: the recordings that bind the old ones go
            // first, so that each layer's old buffer is freed as it grows.
            self.drop_round_recordings();
        }
        self.caches.reserve(gpu, most + k + 1)?;
        let generation = self.caches.generation();
        let mut rec = gpu.recorder();
        let kept = self.rounds.as_ref().expect("begun").kept[slot]
            .as_ref()
            .filter(|p| replay && p.most == most && p.generation == generation);
        if let Some(p) = kept {
            rec.replay(&p.recording);
            self.draft_stats.replayed += 1;
        } else {
            rec.cache_bind_groups(caches_bind_groups(k as u32 + 1));
            for j in 1..k {
                self.mtp_record_into(&mut rec, j as u32, 1, on(j - 1), j as u32 + 1, None)?;
            }
            self.chunk_record(&mut rec, on(0), k + 1, k + 1, None, true)?;
            // The MTP pass runs over the rows the verification placed (P .. P + k; the
            // state's PREV after acceptance), so it reuses their places.
            let verified = At::Placed { most };
            let mtp = self.rounds.as_ref().expect("begun").mtp();
            self.mtp_record_into(&mut rec, mtp, k + 1, verified, 1, Some(slot))?;
            let recording = rec.keep().filter(|_| replay);
            self.rounds.as_mut().expect("begun").kept[slot] =
                recording.map(|recording| KeptRound {
                    most,
                    generation,
                    recording,
                });
        }
        drop(rec);
        self.draft_stats.ms_recording += start.ms();
        self.check_after_submit()?;
        let last = gpu.last_submission();
        self.rounds.as_mut().expect("begun").queued[slot] = last;
        Ok(slot)
    }

    /// How many GPU rounds' recordings the session keeps for replay now (none once a reply's
    /// rounds are over: they hold the buffers they bind).
    pub fn round_recordings(&self) -> usize {
        self.rounds
            .as_ref()
            .map_or(0, |r| r.kept.iter().filter(|k| k.is_some()).count())
    }

    /// Drops the GPU rounds' kept recordings ([`Session::gpu_round`]), and with them their
    /// hold on the buffers they bind.
    pub(crate) fn drop_round_recordings(&mut self) {
        if let Some(r) = self.rounds.as_mut() {
            r.kept.iter_mut().for_each(|k| *k = None);
        }
    }

    /// The tokens the round queued with log `slot` emitted (its accepted drafts and the
    /// main model's token after them), once it has run; counts the round.
    pub(crate) async fn read_gpu_round(&mut self, slot: usize) -> Result<Vec<u32>> {
        let gpu = self.model.gpu.clone();
        let r = self.rounds.as_mut().expect("begun");
        let after = r.queued[slot]
            .take()
            .ok_or_else(|| Error::msg("no speculative round is queued in that slot"))?;
        let (_, bytes) = r.log_bytes(slot);
        let waited = Stopwatch::start();
        let b = gpu
            .read_mapped_async(&r.ring[slot], bytes, Some(after))
            .await?;
        self.draft_stats.ms_waiting += waited.ms();
        let words: Vec<u32> = bytemuck::pod_collect_to_vec(&b);
        let n = words[0] as usize;
        if n == 0 || n > self.drafts + 1 {
            return Err(Error::msg(format!(
                "a speculative round's log says it emitted {n} tokens (1 ..= {})",
                self.drafts + 1
            )));
        }
        self.count_round(self.drafts, n - 1);
        Ok(words[1..=n].to_vec())
    }

    /// The main model's chunk of a prompt's `tokens` at `self.pos` (a prefill) with every
    /// row's logits read back (`want`: how many of the last rows), keeping every row's hidden
    /// after the final norm in `s.mtp_h` for the MTP layer.
    pub(crate) async fn forward_keep_hidden(
        &mut self,
        tokens: &[u32],
        want: usize,
    ) -> Result<Vec<f32>> {
        self.check_tokens(tokens)?;
        self.chunk_forward(Input::Host(tokens), want, None, true, true)?;
        let vocab = self.model.config.vocab_size;
        let gpu = &self.model.gpu;
        gpu.read_f32_async(&self.s.logits, 0, want * vocab).await
    }

    /// Records the final norm of all `t` rows of the chunk into `s.mtp_h`, for the MTP
    /// layer.
    pub(super) fn keep_hidden_rows(&self, rec: &mut crate::gpu::Recorder, t: u32) {
        let cfg = &self.model.config;
        let hd = cfg.hidden_size as u32;
        let (h, out) = (View::rows(&self.s.h, hd), View::rows(&self.s.mtp_h, hd));
        norm::rms_norm(
            rec,
            h,
            &self.model.weights.norm,
            out,
            t,
            hd,
            cfg.rms_norm_eps,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::{round_bound, ROUND_BOUND_STEP};

    #[test]
    fn round_bounds_are_shared_and_never_below_the_position() {
        let (k, ctx) = (3, 1000);
        for most in 0..=ctx - k - 1 {
            let b = round_bound(most, k, ctx);
            assert!(b >= most && b + k < ctx, "{most}: {b}");
            // A multiple of the step where the context has room for it.
            let up = most.next_multiple_of(ROUND_BOUND_STEP);
            if up + k < ctx {
                assert_eq!(b, up, "{most}");
            }
        }
        // Consecutive positions share a bound: rounds between them replay one recording.
        assert_eq!(round_bound(65, k, ctx), round_bound(127, k, ctx));
        assert_ne!(round_bound(64, k, ctx), round_bound(65, k, ctx));
    }
}
