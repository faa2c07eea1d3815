//! Greedy speculative rounds that stay on the GPU (`shaders/spec.wgsl`): a round's first
//! position and its accepted drafts live in a state buffer, so the host queues the next
//! round before reading what this one accepted (src/model/draft.rs).
use super::sample::{self, SampleScratch, TokenSlot};
use super::{Recorder, View};
use crate::gpu::{kernel_params, Kernel, Shader, ShaderCode};

kernel_params! {
    struct Params {
        rows: u32,
        offset: u32,
        lo: u32,
        dim: u32,
        field: u32,
        last: u32,
        k: u32,
        picks: u32,
        mtp: u32,
        log: u32,
        slot: u32,
        pick_at: u32,
        x_off: u32,
        x_stride: u32,
        n: u32,
    }
}

const SPEC: Shader<Params> = Shader::new(
    "spec",
    concat!(
        include_str!("../../shaders/sample_key.wgsl"),
        include_str!("../../shaders/argmax_reduce.wgsl"),
        include_str!("../../shaders/spec.wgsl")
    ),
);

/// This module's shaders (for [`super::shaders`]).
pub(super) const SHADERS: &[ShaderCode] = &[SPEC.code()];

/// The state's words: the next round's first position.
pub const POS: u32 = 0;
/// The last verified round's first position.
pub const PREV: u32 = 1;
/// How many drafts the last verified round accepted: the index of its last accepted row.
pub const ACCEPTED: u32 = 2;
/// Where a round's k + 1 picks of the main model go (after a word the acceptance's
/// workgroups count themselves in).
pub const PICKS: u32 = 4;

/// Where the log slots of rounds of `k` drafts start (after the picks).
pub fn log_word(k: u32) -> u32 {
    PICKS + k + 1
}

/// Words of a state buffer with `slots` log slots for rounds of `k` drafts, a multiple of
/// four (16 bytes: `norm::rms_norm_selected` reads the accepted count from it).
pub fn state_words(k: u32, slots: u32) -> u32 {
    (log_word(k) + slots * (k + 2)).next_multiple_of(4)
}

/// `entry` of spec.wgsl on `rec`'s device (its argmax's workgroup size defined).
fn pipeline(rec: &Recorder, entry: &'static str) -> Kernel<Params> {
    let gpu = rec.gpu();
    gpu.pipeline_n(&SPEC, entry, &["SWG"], &[super::reduce_workgroup(gpu, 256)])
}

/// Where a chunk's rows read their positions: `state[field] + offset + r` for row r.
#[derive(Clone, Copy, Debug)]
pub struct RoundPos<'a> {
    pub state: &'a wgpu::Buffer,
    pub field: u32,
    pub offset: u32,
}

/// Writes the places (`[lo, pos]` a row) and RoPE's cos/sin rows (`dim` floats a row, from
/// `table`, every position's rows up to `last`) of `rows` rows at the positions `at` reads.
#[allow(clippy::too_many_arguments)]
pub fn round_places(
    rec: &mut Recorder,
    at: RoundPos,
    rows: u32,
    lo: u32,
    places: &wgpu::Buffer,
    cos_sin: &wgpu::Buffer,
    (table, dim, last): (&wgpu::Buffer, u32, u32),
) {
    let p = Params {
        rows,
        offset: at.offset,
        lo,
        dim,
        field: at.field,
        last,
        ..Params::default()
    };
    let pipe = pipeline(rec, "round_places");
    let n = rows * dim.max(1);
    let grid = rec.gpu().grid(n.div_ceil(64));
    rec.dispatch(&pipe, &p, &[at.state, places, cos_sin, table], grid);
}

/// Where the acceptance finds a round's tokens in `ids`: the first token at 0, the `k`
/// drafts at `1 ..= k` (and, for [`accept`], the main model's picks at `picks ..= picks +
/// k`); it writes the MTP layer's tokens at `mtp ..`.
#[derive(Clone, Copy, Debug)]
pub struct RoundIds<'a> {
    pub ids: &'a wgpu::Buffer,
    pub k: u32,
    pub picks: u32,
    pub mtp: u32,
}

impl RoundIds<'_> {
    fn params(&self, slot: u32) -> Params {
        Params {
            k: self.k,
            picks: self.picks,
            mtp: self.mtp,
            log: log_word(self.k),
            slot,
            pick_at: PICKS,
            ..Params::default()
        }
    }
}

/// Accepts a greedy round's leading drafts that equal the main model's picks in `ids` (see
/// `shaders/spec.wgsl`), advances `state` and writes the round's tokens to log `slot`.
pub fn accept(rec: &mut Recorder, state: &wgpu::Buffer, r: RoundIds, slot: u32) {
    let pipe = pipeline(rec, "accept");
    rec.dispatch(&pipe, &r.params(slot), &[state, r.ids], [1, 1, 1]);
}

/// Picks the main model's token after each of a round's k + 1 verified rows (the greedy
/// argmax of the `n` logits of each row of `logits`, as `sample::argmax_rows`) and accepts
/// the drafts as [`accept`] does: in one dispatch where a workgroup takes a whole row
/// (`argmax_accept`: rows of up to [`sample::ONE_PASS_MAX`]), else the picks into
/// `ids[picks ..]` first.
pub fn pick_and_accept(
    rec: &mut Recorder,
    state: &wgpu::Buffer,
    (logits, n): (View, u32),
    r: RoundIds,
    slot: u32,
    scratch: &SampleScratch,
) {
    let rows = r.k + 1;
    if n > sample::ONE_PASS_MAX {
        let picks = TokenSlot {
            ids: r.ids,
            index: r.picks,
        };
        sample::argmax_rows(rec, logits, rows, n, picks, scratch);
        accept(rec, state, r, slot);
        return;
    }
    let p = Params {
        x_off: logits.offset,
        x_stride: logits.stride,
        n,
        ..r.params(slot)
    };
    let pipe = pipeline(rec, "argmax_accept");
    rec.cost(4 * (n * rows) as u64, 0, "");
    rec.dispatch(&pipe, &p, &[state, r.ids, logits.buf], [rows, 1, 1]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testutil::{gpu, Rng};

    /// The host's rule: the drafts accepted, the tokens emitted.
    fn accept_ref(drafts: &[u32], picks: &[u32]) -> (usize, Vec<u32>) {
        let n = drafts.iter().zip(picks).take_while(|(d, p)| d == p).count();
        let mut out = drafts[..n].to_vec();
        out.push(picks[n]);
        (n, out)
    }

    /// Where a test round's picks come from.
    #[derive(Clone, Copy, Debug)]
    enum Picks {
        /// Written in `ids` ([`accept`]).
        InIds,
        /// Logits rows of this many values ([`pick_and_accept`]).
        Logits(u32),
    }

    #[test]
    fn accept_takes_the_agreeing_prefix_and_logs_it() {
        accept_cases(Picks::InIds, 11);
    }

    #[test]
    fn pick_and_accept_picks_as_argmax_and_accepts() {
        // One workgroup a row (the built-in model's 6,144 logits, a short odd row, on both
        // kernel sets) and the two-pass argmax before `accept` past ONE_PASS_MAX.
        for cpu in [false, true] {
            crate::kernels::with_cpu_kernels(cpu, || {
                for (i, n) in [6144u32, 77].into_iter().enumerate() {
                    accept_cases(Picks::Logits(n), 20 + i as u64);
                }
            });
        }
        accept_cases(Picks::Logits(sample::ONE_PASS_MAX + 3), 30);
    }

    /// Random rounds of k = 1, 3, 5 drafts, each accepted twice in one submission (the
    /// second into another log slot, from the first's advanced state: the acceptance's
    /// workgroup count must be back at zero), against the host's rule.
    fn accept_cases(how: Picks, seed: u64) {
        let g = gpu();
        let mut rng = Rng::new(seed);
        for k in [1u32, 3, 5] {
            for case in 0..8 {
                let drafts: Vec<u32> = (0..k).map(|_| rng.below(5) as u32).collect();
                // Picks agreeing with the drafts for a random prefix (all of them sometimes).
                let agree = rng.below(k as u64 + 1) as usize;
                let mut picks: Vec<u32> = (0..=k).map(|_| rng.below(5) as u32).collect();
                picks[..agree].copy_from_slice(&drafts[..agree]);
                let (n, want) = accept_ref(&drafts, &picks);
                let (pk, mt) = (k + 3, 2 * k + 7);
                let mut ids = vec![99u32; (mt + k + 2) as usize];
                ids[0] = 42;
                ids[1..=k as usize].copy_from_slice(&drafts);
                if let Picks::InIds = how {
                    ids[pk as usize..=(pk + k) as usize].copy_from_slice(&picks);
                }
                let slots = 3;
                let (slot, slot2) = (case % slots, (case + 1) % slots);
                let mut st = vec![0u32; state_words(k, slots) as usize];
                st[POS as usize] = 1000 + case;
                let ib = g.buffer_from(&ids, "ids").unwrap();
                let sb = g.buffer_from(&st, "state").unwrap();
                let r = RoundIds {
                    ids: &ib,
                    k,
                    picks: pk,
                    mtp: mt,
                };
                let mut rec = g.recorder();
                let scratch = SampleScratch::new(g, 16).unwrap();
                let logits = match how {
                    Picks::InIds => None,
                    Picks::Logits(len) => {
                        // Each row's maximum at its pick, tied further on (the lower index
                        // wins), a NaN before it; rows 3 values apart, from offset 5.
                        let stride = len as usize + 3;
                        let mut l = rng.vec(5 + stride * (k as usize + 1), 1.0);
                        for (r, &p) in picks.iter().enumerate() {
                            let row = 5 + r * stride;
                            l[row + p as usize] = 4.0;
                            l[row + len as usize - 1] = 4.0;
                            l[row + (p as usize + len as usize) / 2] = f32::NAN;
                        }
                        Some((g.buffer_from(&l, "logits").unwrap(), len, stride as u32))
                    }
                };
                for s in [slot, slot2] {
                    match &logits {
                        None => accept(&mut rec, &sb, r, s),
                        Some((lb, len, stride)) => {
                            let x = (View::new(lb, 5, *stride), *len);
                            pick_and_accept(&mut rec, &sb, x, r, s, &scratch);
                        }
                    }
                }
                rec.finish().unwrap();
                let ids2 = g.read_u32(&ib, 0, ids.len()).unwrap();
                let st2 = g.read_u32(&sb, 0, st.len()).unwrap();
                let what = format!("{how:?} k {k}, drafts {drafts:?}, picks {picks:?}");
                assert_eq!(ids2[0], *want.last().unwrap(), "next token: {what}");
                let m = mt as usize;
                assert_eq!(&ids2[m..m + n + 1], &want[..], "MTP tokens: {what}");
                assert_eq!(&ids2[1..=k as usize], &drafts[..], "drafts kept: {what}");
                let step = n as u32 + 1;
                assert_eq!(st2[PREV as usize], 1000 + case + step, "{what}");
                assert_eq!(st2[POS as usize], 1000 + case + 2 * step, "{what}");
                assert_eq!(st2[ACCEPTED as usize], n as u32, "{what}");
                assert_eq!(st2[3], 0, "the workgroup count back at zero: {what}");
                let log = |o: u32| (log_word(k) + o * (k + 2)) as usize;
                for o in 0..slots {
                    let s = log(o);
                    if o == slot || o == slot2 {
                        assert_eq!(st2[s] as usize, n + 1, "{what}");
                        assert_eq!(&st2[s + 1..s + 2 + n], &want[..], "{what}");
                    } else {
                        assert!(st2[s..s + (k + 2) as usize].iter().all(|&w| w == 0));
                    }
                }
            }
        }
    }

    #[test]
    fn round_places_reads_the_state() {
        let g = gpu();
        let (dim, last, lo) = (6u32, 40u32, 7u32);
        let table: Vec<f32> = (0..(last + 1) * dim)
            .map(|i| i as f32 * 0.5 - 3.0)
            .collect();
        let tb = g.buffer_from(&table, "table").unwrap();
        let st = g.buffer_from(&[17u32, 30, 0, 0], "state").unwrap();
        for (field, offset, rows) in [(POS, 0u32, 1u32), (POS, 2, 5), (PREV, 0, 4), (PREV, 8, 5)] {
            let places = g
                .buffer_from(&vec![5u32; 2 * rows as usize + 3], "places")
                .unwrap();
            let cs = g
                .buffer_from(&vec![-1.0f32; (rows * dim) as usize + 2], "cs")
                .unwrap();
            let mut rec = g.recorder();
            let at = RoundPos {
                state: &st,
                field,
                offset,
            };
            round_places(&mut rec, at, rows, lo, &places, &cs, (&tb, dim, last));
            rec.finish().unwrap();
            let base = [17u32, 30][field as usize] + offset;
            let got = g.read_u32(&places, 0, 2 * rows as usize + 3).unwrap();
            let cos = g.read_f32(&cs, 0, (rows * dim) as usize + 2).unwrap();
            for r in 0..rows {
                // Position 38 + 4 passes the table's last row (40): clamped.
                let pos = (base + r).min(last);
                assert_eq!(got[2 * r as usize], lo);
                assert_eq!(
                    got[2 * r as usize + 1],
                    pos,
                    "field {field} offset {offset}"
                );
                let want = &table[(pos * dim) as usize..((pos + 1) * dim) as usize];
                let at = (r * dim) as usize;
                assert_eq!(&cos[at..at + dim as usize], want);
            }
            assert_eq!(&got[2 * rows as usize..], &[5, 5, 5], "past the rows");
            assert_eq!(&cos[(rows * dim) as usize..], &[-1.0, -1.0]);
        }
    }
}
