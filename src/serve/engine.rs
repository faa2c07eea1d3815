//! The engine thread: it owns the sessions (one per slot, each with its own caches) and runs
//! every request on them. HTTP handlers send it [`Job`]s and read [`Out`]s back.
//!
//! **Batched decode.** Each turn of the loop advances every active sequence by one token (a
//! sequence still prefilling runs one prefill chunk instead), so concurrent requests
//! progress together and a new request joins between two turns. The sequences whose tokens
//! the GPU picks (greedy and top-k ≤ 256 sampling, no drafts) decode **together**: one
//! forward over one row per sequence ([`Session::step_batch`]), every weight read once for
//! all of them, each row attending to its own slot's caches (the slots' caches are regions
//! of one pool). It is queued a step ahead: the host reads the tokens of the previous step
//! while the GPU runs this one. Sequences sampled on the host (min-p, presence / frequency
//! penalties) or drafting with the MTP layer step alone, one submission each; so do all when
//! the slots' caches could not be pooled (`--ctx` × `--parallel` past one storage binding).
//!
//! **Prefix cache.** Each slot remembers the tokens its caches hold. A new request goes to the
//! free slot whose tokens share the longest prefix with its prompt; the session is rolled back
//! to that prefix ([`Session::truncate`]) and only the rest is prefilled.
//!
//! **Cancellation.** A request whose receiver is gone (the client disconnected) is dropped at
//! the start of the next turn and its slot is free at once.

use crate::chat::{Part, ReplyText};
use crate::error::{Error, Result};
use crate::generate::{
    round_drafts, speculative_chunk, speculative_keep, speculative_round, Sampler, SamplingParams,
    StopStrings,
};
use crate::kernels::sample::{Sampling, MAX_TOP_K};
use crate::model::{BatchRow, DraftStats, Pick, Session};
use crate::tokenizer::{TextStream, Tokenizer};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;

/// One request for the engine.
pub struct Job {
    /// The whole prompt (the engine finds what a slot already holds).
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    /// Most tokens to generate (at least 1).
    pub max_tokens: usize,
    pub stops: Vec<String>,
    pub eos: Vec<u32>,
    pub kind: Kind,
    pub tx: UnboundedSender<Out>,
    /// Counts the job in [`Load::jobs`] until it is dropped.
    pub _ticket: Ticket,
}

/// How the generated text is read.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    /// A completion: text continuing the prompt, cut at stop strings.
    Text,
    /// A chat reply: `<think>` … `</think>` is reasoning; `in_reasoning` when the prompt
    /// ends inside `<think>`.
    Chat { in_reasoning: bool },
}

/// What the engine sends back for a job, in order: text pieces, then one `Done` or `Error`.
#[derive(Debug)]
pub enum Out {
    Text(Part, String),
    Done(Done),
    Error(String),
}

#[derive(Debug, Clone, Copy)]
pub struct Done {
    /// A stop string or an end-of-sequence token (`stop`), else the token budget or the
    /// context (`length`).
    pub length: bool,
    pub prompt_tokens: usize,
    /// Prompt tokens taken from the slot's caches instead of prefilled.
    pub cached_tokens: usize,
    pub completion_tokens: usize,
}

/// Counters the handlers read (`/health`, the 429 check).
#[derive(Default)]
pub struct Load {
    /// Jobs accepted and not finished (running or waiting).
    pub jobs: AtomicUsize,
    /// Jobs running in a slot.
    pub busy: AtomicUsize,
    /// Set on shutdown: waiting jobs are refused, running ones get `grace` to finish.
    pub draining: AtomicBool,
    /// With `--draft`: what the slots' speculative rounds did so far, all slots together.
    pub drafts: std::sync::Mutex<Option<DraftStats>>,
}

/// A job's place in [`Load::jobs`]: taken by [`Load::admit`], given back when dropped.
pub struct Ticket(Arc<Load>);

impl Drop for Ticket {
    fn drop(&mut self) {
        self.0.jobs.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Load {
    /// A ticket when fewer than `limit` jobs are in the engine, else `None`.
    pub fn admit(self: &Arc<Self>, limit: usize) -> Option<Ticket> {
        let mut n = self.jobs.load(Ordering::SeqCst);
        loop {
            if n >= limit {
                return None;
            }
            match self
                .jobs
                .compare_exchange(n, n + 1, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return Some(Ticket(self.clone())),
                Err(now) => n = now,
            }
        }
    }
}

/// The text side of a running sequence: detokenizing, stop strings, reasoning.
enum Reply<'t> {
    Text(TextStream<'t>, StopStrings),
    Chat(TextStream<'t>, ReplyText),
}

impl Reply<'_> {
    fn push(&mut self, id: u32) -> Result<(Vec<(Part, String)>, bool)> {
        match self {
            Reply::Text(t, s) => {
                let piece = s.push(&t.push(id)?);
                Ok((text_part(piece), s.hit()))
            }
            Reply::Chat(t, r) => {
                let parts = r.push(&t.push(id)?);
                Ok((parts, r.stopped()))
            }
        }
    }

    fn finish(&mut self) -> Vec<(Part, String)> {
        match self {
            Reply::Text(_, s) => text_part(s.finish()),
            Reply::Chat(_, r) => r.finish(),
        }
    }
}

fn text_part(s: String) -> Vec<(Part, String)> {
    if s.is_empty() {
        Vec::new()
    } else {
        vec![(Part::Content, s)]
    }
}

/// A request running in a slot.
struct Seq<'t> {
    job: Job,
    /// Prompt tokens still to prefill (from `prefilled` on).
    prefilled: usize,
    reused: usize,
    out: Vec<u32>,
    sampler: Sampler,
    /// The GPU picks the tokens (else the host samples from the logits).
    gpu: bool,
    /// GPU: the pick slot holding the next token to read.
    pick: usize,
    /// Host: the token sampled and not yet processed.
    next: Option<u32>,
    /// GPU: the step after the token being read is queued.
    ahead: bool,
    /// Speculative decoding (the session drafts): the last token emitted, at `session.pos`
    /// and not yet run, which the next round verifies its drafts after.
    spec: Option<u32>,
    reply: Reply<'t>,
}

struct Slot<'t> {
    session: Session,
    /// The tokens in the caches (positions `0 .. len`).
    cached: Vec<u32>,
    last_used: u64,
    seq: Option<Seq<'t>>,
}

/// How the engine runs.
pub struct EngineOptions {
    /// How long running requests may go on after shutdown begins.
    pub grace: Duration,
}

/// Runs the engine until every sender of `rx` is gone (and, once draining, until the running
/// requests are done or `grace` has passed).
pub fn run(
    sessions: Vec<Session>,
    tok: &Tokenizer,
    rx: Receiver<Job>,
    load: Arc<Load>,
    opts: EngineOptions,
) {
    let mut slots: Vec<Slot> = sessions
        .into_iter()
        .map(|session| Slot {
            session,
            cached: Vec::new(),
            last_used: 0,
            seq: None,
        })
        .collect();
    let mut waiting: VecDeque<Job> = VecDeque::new();
    let mut clock = 0u64;
    let mut open = true;
    let mut drain_deadline: Option<Instant> = None;
    loop {
        let active = slots.iter().any(|s| s.seq.is_some());
        if !active && waiting.is_empty() {
            if !open {
                break;
            }
            // Idle: wait for a job, waking now and then to see a shutdown.
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(j) => waiting.push_back(j),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => open = false,
            }
        }
        loop {
            match rx.try_recv() {
                Ok(j) => waiting.push_back(j),
                Err(std::sync::mpsc::TryRecvError::Empty) => break,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        let draining = load.draining.load(Ordering::SeqCst);
        if draining {
            for j in waiting.drain(..) {
                let _ = j.tx.send(Out::Error("the server is shutting down".into()));
            }
            let deadline = *drain_deadline.get_or_insert_with(|| Instant::now() + opts.grace);
            if Instant::now() >= deadline {
                for slot in slots.iter_mut() {
                    if let Some(seq) = slot.seq.take() {
                        let _ = seq.job.tx.send(Out::Error(
                            "the server shut down before the reply was finished".into(),
                        ));
                        slot.end(Some(seq));
                    }
                }
            }
            if !open && !slots.iter().any(|s| s.seq.is_some()) {
                break;
            }
        }
        // Requests whose client is gone.
        waiting.retain(|j| !j.tx.is_closed());
        for slot in slots.iter_mut() {
            if slot.seq.as_ref().is_some_and(|s| s.job.tx.is_closed()) {
                let seq = slot.seq.take();
                slot.end(seq);
            }
        }
        // Newcomers into free slots, the longest shared prefix first.
        while !waiting.is_empty() {
            let Some(job) = waiting.pop_front() else {
                break;
            };
            let best = slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.seq.is_none())
                .map(|(i, s)| {
                    (
                        common_prefix(&s.cached, &job.prompt),
                        u64::MAX - s.last_used,
                        i,
                    )
                })
                .max();
            let Some((_, _, i)) = best else {
                waiting.push_front(job);
                break;
            };
            clock += 1;
            slots[i].last_used = clock;
            slots[i].start(job, tok);
        }
        load.busy.store(
            slots.iter().filter(|s| s.seq.is_some()).count(),
            Ordering::SeqCst,
        );
        // One token (or prefill chunk) for every running request: first those that do not
        // decode with GPU picks (prefill chunks, host sampling, speculative rounds), then one
        // batched step for the rest, then their tokens.
        for slot in slots.iter_mut() {
            if slot.seq.is_some() && !slot.gpu_decoding() {
                guarded(slot, |s| s.advance());
            }
        }
        step_together(&mut slots);
        for slot in slots.iter_mut() {
            if slot.gpu_decoding() {
                guarded(slot, |s| s.take_token());
            }
        }
        load.busy.store(
            slots.iter().filter(|s| s.seq.is_some()).count(),
            Ordering::SeqCst,
        );
        if slots.iter().any(|s| s.session.drafts() > 0) {
            let mut all = DraftStats::default();
            for s in &slots {
                all.add(&s.session.draft_stats());
            }
            *crate::gpu::lock(&load.drafts) = Some(all);
        }
    }
}

/// Runs `f` on the slot; an error (or a panic) ends its request with that error and resets
/// the slot.
fn guarded(slot: &mut Slot, f: impl FnOnce(&mut Slot) -> Result<()>) {
    if let Some(err) = caught(|| f(&mut *slot)) {
        fail(slot, err);
    }
}

/// Runs `f`: its error, or a panic's, as the message the request fails with.
fn caught(f: impl FnOnce() -> Result<()>) -> Option<String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e.0),
        Err(_) => Some("internal error (a panic in the engine)".to_string()),
    }
}

/// Ends the slot's request with `err`; its caches' state is unknown, so it starts afresh.
fn fail(slot: &mut Slot, err: String) {
    log::error!("request failed: {err}");
    if let Some(seq) = slot.seq.take() {
        let _ = seq.job.tx.send(Out::Error(err));
    }
    slot.session.reset();
    slot.cached.clear();
}

/// Queues the next step of every GPU-decoding sequence that needs a token after the one
/// waiting to be read: one batched step for those whose caches share a pool, alone for the
/// others. A failed batch fails each of its requests.
fn step_together(slots: &mut [Slot]) {
    let mut rows = Vec::new();
    let mut owners = Vec::new();
    for (i, slot) in slots.iter_mut().enumerate() {
        if let Some(row) = slot.queue_ahead() {
            rows.push(row);
            owners.push(i);
        }
    }
    // Rows whose session shares a group's pool join it; the rest step alone.
    let batch = batching();
    let mut groups: Vec<(Vec<BatchRow>, Vec<usize>)> = Vec::new();
    for (row, i) in rows.into_iter().zip(owners) {
        let joins = groups.iter().position(|(g, _)| {
            let lead = &g[0].session;
            batch && g.len() < lead.chunk && lead.caches.same_pool(&row.session.caches)
        });
        match joins {
            Some(k) => {
                groups[k].0.push(row);
                groups[k].1.push(i);
            }
            None => groups.push((vec![row], vec![i])),
        }
    }
    let mut failed = Vec::new();
    for (mut group, owners) in groups {
        if let Some(err) = caught(|| Session::step_batch(&mut group)) {
            failed.extend(owners.into_iter().map(|i| (i, err.clone())));
        }
    }
    for (i, err) in failed {
        fail(&mut slots[i], err);
    }
}

/// Whether rows that share a pool step together. `SPARSA_SERVE_BATCH=0`: every row alone
/// (what the engine did before batching; a measurement aid).
fn batching() -> bool {
    crate::knobs::knob_on!("SPARSA_SERVE_BATCH")
}

/// Compiles, before the first request, the pipelines of every batched step the engine can
/// run on `sessions` (the slots, between conversations) with throwaway steps
/// ([`Session::warm_batch`]) of each width from 1 to the number of slots that share the
/// first one's cache pool (at most a prefill chunk, as [`step_together`] groups them).
/// Otherwise the first step of each width compiles them mid-request, and every request
/// running then stalls (each new width compiles its matrix-vector products; on lavapipe a
/// tenth of a second a width with the built-in model, more with larger ones). Slots that
/// draft never step in a batch, so nothing is warmed for them. Leaves the sessions as they
/// were.
pub fn warm(sessions: &mut [Session]) -> Result<()> {
    let Some(first) = sessions.first() else {
        return Ok(());
    };
    if first.drafts() > 0 {
        return Ok(());
    }
    let pooled = sessions
        .iter()
        .take_while(|s| s.caches.same_pool(&first.caches))
        .count();
    let widest = if batching() {
        pooled.min(first.chunk).max(1)
    } else {
        1
    };
    let t0 = Instant::now();
    for width in 1..=widest {
        Session::warm_batch(&mut sessions[..width])
            .map_err(|e| e.context(format!("warming up a batched step of {width} slots")))?;
    }
    log::info!(
        "warm-up: the pipelines of batched steps of widths 1 to {widest} compiled in {:.2} s",
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl<'t> Slot<'t> {
    fn start(&mut self, job: Job, tok: &'t Tokenizer) {
        let prompt = &job.prompt;
        let known = self.cached.len().min(self.session.pos);
        // At least the last prompt token runs, for the logits of the first new one. When
        // drafting, one more: the MTP layer's row before the new tokens pairs the hidden
        // row there with the token after it, which this prompt may change.
        let drafting = usize::from(self.session.drafts() > 0);
        let reused = common_prefix(&self.cached[..known], prompt)
            .min(prompt.len().saturating_sub(1))
            .saturating_sub(drafting);
        self.session.truncate(reused);
        self.cached.truncate(reused);
        let text = match job.kind {
            Kind::Text => TextStream::after(tok, prompt).unwrap_or_else(|_| TextStream::new(tok)),
            Kind::Chat { .. } => TextStream::new(tok),
        };
        let reply = match job.kind {
            Kind::Text => Reply::Text(text, StopStrings::new(job.stops.clone())),
            Kind::Chat { in_reasoning } => {
                Reply::Chat(text, ReplyText::new(job.stops.clone(), in_reasoning))
            }
        };
        let sampler = Sampler::new(job.params.clone());
        // Speculative rounds sample on the host.
        let gpu = gpu_picks(&job.params) && self.session.drafts() == 0;
        self.seq = Some(Seq {
            job,
            prefilled: reused,
            reused,
            out: Vec::new(),
            sampler,
            gpu,
            pick: 0,
            next: None,
            ahead: false,
            spec: None,
            reply,
        });
    }

    /// Ends the sequence (sending `Done` when given one) and keeps the cached tokens.
    fn end(&mut self, seq: Option<Seq>) {
        let Some(mut seq) = seq else {
            return;
        };
        let mut all = std::mem::take(&mut seq.job.prompt);
        all.truncate(seq.prefilled);
        if seq.prefilled == all.len() {
            all.extend_from_slice(&seq.out);
        }
        let keep = self.session.pos.min(all.len());
        self.session.truncate(keep);
        all.truncate(keep);
        self.cached = all;
    }

    fn finish(&mut self, length: bool) {
        let Some(mut seq) = self.seq.take() else {
            return;
        };
        for (part, s) in seq.reply.finish() {
            let _ = seq.job.tx.send(Out::Text(part, s));
        }
        let done = Done {
            length,
            prompt_tokens: seq.job.prompt.len(),
            cached_tokens: seq.reused,
            completion_tokens: seq.out.len(),
        };
        let _ = seq.job.tx.send(Out::Done(done));
        self.end(Some(seq));
    }

    /// One prefill chunk or one token.
    fn advance(&mut self) -> Result<()> {
        let Some(seq) = self.seq.as_mut() else {
            return Ok(());
        };
        let s = &mut self.session;
        let n = seq.job.prompt.len();
        if seq.prefilled < n {
            let end = (seq.prefilled + s.chunk.max(1)).min(n);
            let part = &seq.job.prompt[seq.prefilled..end];
            let last = end == n;
            if s.drafts() > 0 {
                // The main model, then the MTP layer one token further on.
                let following = seq.job.prompt.get(end).copied();
                let next = speculative_chunk(s, part, following, &mut seq.sampler, &seq.out);
                seq.next = pollster::block_on(next)?;
            } else if seq.gpu {
                if last {
                    let r = draw(&mut seq.sampler);
                    let pick = gpu_pick(&seq.job.params, r);
                    s.forward_pick(part, Some((0, &pick)))?;
                    seq.pick = 0;
                } else {
                    s.forward_pick(part, None)?;
                }
            } else {
                let logits = s.forward(part, false)?;
                if last {
                    seq.next = Some(seq.sampler.sample_after(logits.last(), &seq.out));
                }
            }
            seq.prefilled = end;
            return Ok(());
        }
        if s.drafts() > 0 {
            return self.round();
        }
        if seq.gpu {
            // Its steps are queued by `step_together` and read by `take_token`.
            return Err(Error::msg(
                "internal error: a GPU-decoding sequence stepped outside the batch",
            ));
        }
        let next = seq
            .next
            .take()
            .ok_or_else(|| Error::msg("no token is waiting"))?;
        self.emit_next(next, false)
    }

    /// Whether the sequence decodes with GPU picks: its steps go in the turn's batch.
    fn gpu_decoding(&self) -> bool {
        self.seq
            .as_ref()
            .is_some_and(|q| q.gpu && q.prefilled == q.job.prompt.len())
    }

    /// A GPU-decoding sequence's next step, unless the token about to be read is surely its
    /// last: the row to queue (into the pick slot not being read) for [`step_together`].
    fn queue_ahead(&mut self) -> Option<BatchRow<'_, 'static>> {
        if !self.gpu_decoding() {
            return None;
        }
        let seq = self.seq.as_mut()?;
        let s = &mut self.session;
        seq.ahead = seq.out.len() + 1 < seq.job.max_tokens && s.pos < s.max_ctx();
        if !seq.ahead {
            return None;
        }
        let r = draw(&mut seq.sampler);
        Some(BatchRow {
            session: s,
            slot: 1 - seq.pick,
            pick: gpu_pick(&seq.job.params, r),
        })
    }

    /// A GPU-decoding sequence's turn after the batched step: its token read and emitted.
    fn take_token(&mut self) -> Result<()> {
        let Some(seq) = self.seq.as_mut() else {
            return Ok(());
        };
        let next = pollster::block_on(self.session.picked_token(seq.pick))?;
        seq.pick = 1 - seq.pick;
        let ahead = std::mem::take(&mut seq.ahead);
        self.emit_next(next, ahead)
    }

    /// Emits `next` (with `ahead`, the step after it is already queued) and ends the reply
    /// there if it is the last; a host-sampled sequence runs it for the next token.
    fn emit_next(&mut self, next: u32, ahead: bool) -> Result<()> {
        let Some(seq) = self.seq.as_mut() else {
            return Ok(());
        };
        let s = &mut self.session;
        // Where `next` goes in the caches.
        let pos = s.pos - usize::from(ahead);
        if let Some(length) = seq.emit(next, pos, s.max_ctx())? {
            if ahead {
                s.truncate(pos);
            }
            self.finish(length);
            return Ok(());
        }
        if !seq.gpu {
            let logits = s.forward(&[next], false)?;
            seq.next = Some(seq.sampler.sample_after(logits.last(), &seq.out));
        }
        Ok(())
    }

    /// A speculative decode's turn: the first token (from the prefill) emitted, or one
    /// round (the drafts, one verification, then the MTP layer over the kept rows).
    fn round(&mut self) -> Result<()> {
        let Some(seq) = self.seq.as_mut() else {
            return Ok(());
        };
        let s = &mut self.session;
        let max_ctx = s.max_ctx();
        if let Some(first) = seq.next.take() {
            match seq.emit(first, s.pos, max_ctx)? {
                Some(length) => self.finish(length),
                None => seq.spec = Some(first),
            }
            return Ok(());
        }
        let next = seq
            .spec
            .take()
            .ok_or_else(|| Error::msg("no token is waiting"))?;
        let p = s.pos;
        let k = round_drafts(s, seq.job.max_tokens.saturating_sub(seq.out.len()));
        let emitted =
            pollster::block_on(speculative_round(s, next, k, &mut seq.sampler, &seq.out))?;
        let mut end = None;
        let mut m = 0;
        for &g in &emitted {
            m += 1;
            end = seq.emit(g, p + m, max_ctx)?;
            if end.is_some() {
                break;
            }
        }
        speculative_keep(s, p, &emitted[..m])?;
        match end {
            Some(length) => self.finish(length),
            None => seq.spec = Some(emitted[m - 1]),
        }
        Ok(())
    }
}

impl Seq<'_> {
    /// Emits `next` (going to position `pos` of the caches): into the output and, unless it
    /// is an end-of-sequence token, the reply's text. `Some(length)` when the reply ends
    /// there (`length`: at the token budget or the context, not at a stop).
    fn emit(&mut self, next: u32, pos: usize, max_ctx: usize) -> Result<Option<bool>> {
        self.out.push(next);
        let mut stop = self.job.eos.contains(&next);
        if !stop {
            let (parts, hit) = self.reply.push(next)?;
            for (part, text) in parts {
                let _ = self.job.tx.send(Out::Text(part, text));
            }
            stop = hit;
        }
        let length = self.out.len() >= self.job.max_tokens || pos >= max_ctx;
        Ok((stop || length).then_some(!stop))
    }
}

/// Whether the GPU can pick the tokens: greedy or top-k ≤ 256 sampling, without min-p or the
/// presence / frequency penalties (those sample on the host).
fn gpu_picks(p: &SamplingParams) -> bool {
    Sampler::new(p.clone()).gpu_can_pick() && !p.penalizes()
}

fn draw(sampler: &mut Sampler) -> f32 {
    // f32 below 1, as the host's f64 draw is.
    (sampler.draw() as f32).min(1.0 - f32::EPSILON / 2.0)
}

fn gpu_pick(p: &SamplingParams, r: f32) -> Pick<'static> {
    if p.is_greedy() {
        return Pick::Argmax;
    }
    Pick::Sample {
        s: Sampling {
            temperature: p.temperature,
            top_p: p.top_p,
            top_k: (p.top_k as u32).min(MAX_TOP_K),
            penalty: 1.0,
            r,
        },
        window: &[],
        prev: false,
    }
}
