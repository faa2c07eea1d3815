//! Which routed experts of one layer sit in its GPU slots, and which one leaves on a miss.
//!
//! Host-only bookkeeping (no GPU here), so that the same code runs the real cache and
//! replays routing traces offline ([`simulate`]) to compare policies.

/// No expert / no slot.
pub const NONE: u32 = u32::MAX;

/// The replacement policy of the routed-expert cache (`--expert-policy`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Policy {
    /// Least recently used slot leaves.
    Lru,
    /// Frequency-aware: the resident expert with the lowest decayed use count leaves (ties:
    /// least recently used). Each use adds 1; every token multiplies all counts of the layer
    /// by `decay`, so an expert hot long ago fades.
    Lfu { decay: f32 },
}

/// The decay per token of [`Policy::Lfu`] that `--expert-policy lfu` uses (see
/// BENCHMARKS.md "Expert offloading" for the traces it was chosen on).
pub const LFU_DECAY: f32 = 0.99;

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Policy, String> {
        match s {
            "lru" => Ok(Policy::Lru),
            "lfu" => Ok(Policy::Lfu { decay: LFU_DECAY }),
            _ => match s.strip_prefix("lfu:").map(str::parse::<f32>) {
                Some(Ok(d)) if d > 0.0 && d <= 1.0 => Ok(Policy::Lfu { decay: d }),
                _ => Err(format!(
                    "expected lru, lfu or lfu:DECAY with 0 < DECAY ≤ 1, got {s:?}"
                )),
            },
        }
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            Policy::Lru => write!(f, "lru"),
            Policy::Lfu { decay } => write!(f, "lfu:{decay}"),
        }
    }
}

/// The slots of one layer: which expert each holds, and the policy's state.
pub struct SlotTable {
    policy: Policy,
    /// Expert in each slot (NONE: empty).
    slot_expert: Vec<u32>,
    /// Slot of each expert (NONE: not resident).
    expert_slot: Vec<u32>,
    /// Per slot: the clock of its last use.
    last_use: Vec<u64>,
    /// Per expert: decayed use count (Lfu), stored divided by `scale`.
    freq: Vec<f64>,
    /// All counts are `freq * scale`; decaying divides `1 / scale` instead of touching
    /// every count (renormalized when it grows large).
    scale: f64,
    clock: u64,
}

/// What [`SlotTable::place`] did for one round.
pub struct Round {
    /// `(expert, slot)` pairs to upload before the round runs.
    pub uploads: Vec<(u32, u32)>,
    /// Per routed pair of the chunk: the slot that serves it in this round, or NONE.
    pub slots: Vec<u32>,
    /// Pairs served by a resident expert (hits) in this round.
    pub hits: usize,
    /// Pairs served in this round.
    pub served: usize,
}

impl SlotTable {
    pub fn new(slots: usize, n_experts: usize, policy: Policy) -> SlotTable {
        SlotTable {
            policy,
            slot_expert: vec![NONE; slots],
            expert_slot: vec![NONE; n_experts],
            last_use: vec![0; slots],
            freq: vec![0.0; n_experts],
            scale: 1.0,
            clock: 0,
        }
    }

    pub fn slots(&self) -> usize {
        self.slot_expert.len()
    }

    pub fn slot_of(&self, expert: u32) -> Option<u32> {
        self.expert_slot
            .get(expert as usize)
            .copied()
            .filter(|&s| s != NONE)
    }

    /// The distinct experts of `experts` that are not resident.
    pub fn misses(&self, experts: &[u32]) -> usize {
        let mut seen: Vec<u32> = Vec::with_capacity(experts.len());
        for &e in experts {
            if self.slot_of(e).is_none() && !seen.contains(&e) {
                seen.push(e);
            }
        }
        seen.len()
    }

    /// Experts resident now, by slot.
    pub fn residents(&self) -> &[u32] {
        &self.slot_expert
    }

    /// One token's worth of time passed (decays the frequency counts).
    pub fn tick(&mut self) {
        if let Policy::Lfu { decay } = self.policy {
            self.scale *= decay as f64;
            if self.scale < 1e-200 {
                for f in &mut self.freq {
                    *f *= self.scale;
                }
                self.scale = 1.0;
            }
        }
    }

    fn count(&self, e: u32) -> f64 {
        self.freq[e as usize] * self.scale
    }

    fn victim(&self, pinned: &[bool]) -> usize {
        let mut best = usize::MAX;
        for (s, &pin) in pinned.iter().enumerate() {
            if pin {
                continue;
            }
            if self.slot_expert[s] == NONE {
                return s;
            }
            if best == usize::MAX {
                best = s;
                continue;
            }
            let better = match self.policy {
                Policy::Lru => self.last_use[s] < self.last_use[best],
                Policy::Lfu { .. } => {
                    let (a, b) = (
                        self.count(self.slot_expert[s]),
                        self.count(self.slot_expert[best]),
                    );
                    a < b || (a == b && self.last_use[s] < self.last_use[best])
                }
            };
            if better {
                best = s;
            }
        }
        best
    }

    /// Put expert `e` in the policy's victim slot (not a pinned one), which it pins.
    fn install(&mut self, e: u32, pinned: &mut [bool]) -> u32 {
        let v = self.victim(pinned);
        let old = self.slot_expert[v];
        if old != NONE {
            self.expert_slot[old as usize] = NONE;
        }
        self.slot_expert[v] = e;
        self.expert_slot[e as usize] = v as u32;
        pinned[v] = true;
        v as u32
    }

    /// Plan the rounds that serve `experts` (one chunk's routed choices, `rows × k`, every
    /// id < n_experts): each round makes at most `slots` experts resident (hits stay where
    /// they are, misses take the policy's victims) and serves the pairs of those experts.
    /// One round when the chunk's distinct experts fit the slots (every decode step with
    /// slots ≥ k).
    pub fn place(&mut self, experts: &[u32]) -> Vec<Round> {
        let want = self.count_uses(experts);
        let mut rounds = Vec::new();
        for group in want.chunks(self.slots()) {
            rounds.push(self.serve_group(group, experts));
        }
        rounds
    }

    /// One round for a chunk whose misses may run elsewhere (on the CPU): hits are served
    /// from their slots; a miss is made resident when `upload(e)` says uploading it is the
    /// cheaper way, when a slot is empty (the cache fills), or, for one miss per chunk, when
    /// its use count is at least twice its victim's plus one (a hot expert comes in, slowly
    /// enough that the cache does not churn). The pairs of the other misses are left NONE in
    /// the round's slots and returned (their indices in `experts`).
    pub fn place_hybrid(
        &mut self,
        experts: &[u32],
        mut upload: impl FnMut(u32) -> bool,
    ) -> (Round, Vec<usize>) {
        let want = self.count_uses(experts);
        let hits = want
            .iter()
            .take_while(|&&e| self.expert_slot[e as usize] != NONE)
            .count();
        let mut group: Vec<u32> = want[..hits].to_vec();
        let mut pinned = vec![false; self.slots()];
        for &e in &group {
            pinned[self.expert_slot[e as usize] as usize] = true;
        }
        let mut admitted = false;
        for &e in &want[hits..] {
            if group.len() >= self.slots() {
                break;
            }
            let v = self.victim(&pinned);
            let empty = self.slot_expert[v] == NONE;
            let hot =
                !empty && !admitted && self.count(e) >= 2.0 * self.count(self.slot_expert[v]) + 1.0;
            if upload(e) || empty || hot {
                admitted |= hot;
                pinned[v] = true;
                group.push(e);
            }
        }
        let round = self.serve_group(&group, experts);
        let elsewhere = (0..experts.len())
            .filter(|&p| round.slots[p] == NONE)
            .collect();
        (round, elsewhere)
    }

    /// Count one chunk's uses: its distinct experts in order of first use, the resident
    /// ones first (so hits are served before anything is evicted).
    fn count_uses(&mut self, experts: &[u32]) -> Vec<u32> {
        let mut distinct: Vec<u32> = Vec::new();
        for &e in experts {
            if !distinct.contains(&e) {
                distinct.push(e);
            }
        }
        for &e in experts {
            self.freq[e as usize] += 1.0 / self.scale;
        }
        let (mut want, miss): (Vec<u32>, Vec<u32>) = distinct
            .into_iter()
            .partition(|&e| self.expert_slot[e as usize] != NONE);
        want.extend(miss);
        want
    }

    /// One round serving the pairs of `group` (at most `slots` distinct experts, residents
    /// and misses): misses take the policy's victims among the slots the group does not use.
    fn serve_group(&mut self, group: &[u32], experts: &[u32]) -> Round {
        let mut pinned = vec![false; self.slots()];
        for &e in group {
            let s = self.expert_slot[e as usize];
            if s != NONE {
                pinned[s as usize] = true;
            }
        }
        let mut round = Round {
            uploads: Vec::new(),
            slots: vec![NONE; experts.len()],
            hits: 0,
            served: 0,
        };
        for &e in group {
            self.clock += 1;
            let mut s = self.expert_slot[e as usize];
            if s == NONE {
                s = self.install(e, &mut pinned);
                round.uploads.push((e, s));
            }
            self.last_use[s as usize] = self.clock;
            let uploaded = round.uploads.last().is_some_and(|&(x, _)| x == e);
            for (i, &x) in experts.iter().enumerate() {
                if x == e {
                    round.slots[i] = s;
                    round.served += 1;
                    if !uploaded {
                        round.hits += 1;
                    }
                }
            }
        }
        round
    }

    /// Make `experts` resident ahead of their use (prefetch): returns the `(expert, slot)`
    /// uploads. Not a use: counts do not change; each loaded expert counts as just used for
    /// LRU, so the next miss does not evict it at once. At most `slots` experts.
    pub fn prefetch(&mut self, experts: &[u32]) -> Vec<(u32, u32)> {
        let mut pinned = vec![false; self.slots()];
        let mut out = Vec::new();
        for &e in experts.iter().take(self.slots()) {
            let s = self.expert_slot[e as usize];
            if s != NONE {
                pinned[s as usize] = true;
                continue;
            }
            let v = self.install(e, &mut pinned);
            self.clock += 1;
            self.last_use[v as usize] = self.clock;
            out.push((e, v));
        }
        out
    }

    /// Forget every resident (the slots' contents were lost or never written).
    pub fn clear(&mut self) {
        self.slot_expert.fill(NONE);
        self.expert_slot.fill(NONE);
    }
}

/// Hit rate of `policy` with `slots` slots on a routing trace of one layer: per token, the
/// experts it chose. Counts expert uses (a token's k choices), like the live cache.
pub fn simulate(trace: &[Vec<u32>], n_experts: usize, slots: usize, policy: Policy) -> f64 {
    let mut t = SlotTable::new(slots, n_experts, policy);
    let (mut hits, mut uses) = (0usize, 0usize);
    for tok in trace {
        for r in t.place(tok) {
            hits += r.hits;
            uses += r.served;
        }
        t.tick();
    }
    hits as f64 / uses.max(1) as f64
}

/// The best hit rate any policy can reach on `trace` with `slots` slots (Belady: on a miss,
/// evict the resident whose next use is farthest away), served as [`SlotTable::place`]
/// serves a token: its resident experts first (hits), then its misses.
pub fn belady(trace: &[Vec<u32>], slots: usize) -> f64 {
    let mut resident: Vec<u32> = Vec::new();
    let (mut hits, mut uses) = (0usize, 0usize);
    let next_use = |e: u32, from: usize| -> usize {
        (from..trace.len())
            .find(|&j| trace[j].contains(&e))
            .unwrap_or(usize::MAX)
    };
    for (i, tok) in trace.iter().enumerate() {
        uses += tok.len();
        hits += tok.iter().filter(|e| resident.contains(e)).count();
        let mut misses: Vec<u32> = Vec::new();
        for &e in tok {
            if !resident.contains(&e) && !misses.contains(&e) {
                misses.push(e);
            }
        }
        for e in misses {
            if resident.len() >= slots {
                // Everything resident has been served this token (or is not needed by it):
                // its next use is after this token.
                let far = resident
                    .iter()
                    .enumerate()
                    .max_by_key(|&(_, &r)| next_use(r, i + 1))
                    .map(|(j, _)| j);
                if let Some(j) = far {
                    resident.remove(j);
                }
            }
            resident.push(e);
        }
    }
    hits as f64 / uses.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hybrid_fills_empty_slots_then_leaves_misses_elsewhere() {
        let mut t = SlotTable::new(2, 8, Policy::Lfu { decay: 1.0 });
        // Empty slots fill: both experts are uploaded, nothing runs elsewhere.
        let (r, cpu) = t.place_hybrid(&[1, 2], |_| false);
        assert_eq!((r.uploads.len(), cpu.len()), (2, 0));
        // Full: a cold miss runs elsewhere, the hit stays.
        let (r, cpu) = t.place_hybrid(&[1, 3], |_| false);
        assert_eq!((r.hits, r.uploads.len(), cpu), (1, 0, vec![1]));
        assert_eq!(r.slots[1], NONE);
        // Uploading chosen by the cost: 4 replaces the coldest resident (2; 1 is used).
        let (r, cpu) = t.place_hybrid(&[1, 4], |e| e == 4);
        assert_eq!(
            (r.uploads, cpu.len()),
            (vec![(4, t.slot_of(4).unwrap())], 0)
        );
        assert_eq!(t.slot_of(2), None);
        // A hot expert comes in once its count reaches twice its victim's plus one (3: 2
        // uses against 4's 1 is not enough, 3 uses is), one per chunk.
        let (r, _) = t.place_hybrid(&[3, 5], |_| false);
        assert!(r.uploads.is_empty());
        let (r, cpu) = t.place_hybrid(&[3, 6], |_| false);
        assert_eq!((r.uploads.len(), cpu), (1, vec![1]));
        assert!(t.slot_of(3).is_some() && t.slot_of(4).is_none());
    }

    #[test]
    fn lru_evicts_the_least_recent_and_keeps_hits_in_place() {
        let mut t = SlotTable::new(2, 8, Policy::Lru);
        let r = t.place(&[1, 2]);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].uploads, vec![(1, 0), (2, 1)]);
        assert_eq!(r[0].hits, 0);
        t.tick();
        // 2 is used again (hit), 3 misses: 1 was used longest ago and leaves.
        let r = t.place(&[2, 3]);
        assert_eq!(r[0].uploads, vec![(3, 0)]);
        assert_eq!(r[0].slots, vec![1, 0]);
        assert_eq!((r[0].hits, r[0].served), (1, 2));
        assert_eq!(t.slot_of(1), None);
    }

    #[test]
    fn lfu_keeps_the_frequent_expert() {
        let mut t = SlotTable::new(2, 8, Policy::Lfu { decay: 1.0 });
        for _ in 0..5 {
            t.place(&[1]);
            t.tick();
        }
        t.place(&[2]);
        t.tick();
        // 3 misses: LRU would evict 1 (older), LFU evicts 2 (used once).
        let r = t.place(&[3]);
        assert_eq!(r[0].uploads, vec![(3, 1)]);
        assert_eq!(t.slot_of(1), Some(0));
    }

    #[test]
    fn more_distinct_experts_than_slots_take_several_rounds() {
        let mut t = SlotTable::new(1, 8, Policy::Lru);
        t.place(&[5]);
        // Rows × k = 3 × 2: experts 5 (resident), 1, 6.
        let routed = [1, 5, 6, 1, 5, 6];
        let rounds = t.place(&routed);
        assert_eq!(rounds.len(), 3);
        // The resident expert is served first, with no upload.
        assert!(rounds[0].uploads.is_empty());
        assert_eq!(rounds[0].slots, vec![NONE, 0, NONE, NONE, 0, NONE]);
        assert_eq!(rounds[1].uploads, vec![(1, 0)]);
        assert_eq!(rounds[2].uploads, vec![(6, 0)]);
        // Every pair is served exactly once.
        for i in 0..routed.len() {
            let n = rounds.iter().filter(|r| r.slots[i] != NONE).count();
            assert_eq!(n, 1, "pair {i}");
        }
        assert_eq!(rounds.iter().map(|r| r.hits).sum::<usize>(), 2);
    }

    #[test]
    fn belady_bounds_the_policies() {
        // A cyclic trace over 3 experts with 2 slots: LRU misses every time, Belady half.
        let trace: Vec<Vec<u32>> = (0..30).map(|i| vec![i % 3]).collect();
        assert_eq!(simulate(&trace, 3, 2, Policy::Lru), 0.0);
        let b = belady(&trace, 2);
        assert!(b > 0.4, "{b}");
        assert!(simulate(&trace, 3, 2, Policy::Lfu { decay: 0.9 }) <= b);
    }

    #[test]
    fn belady_is_never_beaten() {
        let mut x = 12345u64;
        let mut rnd = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n) as u32
        };
        for slots in 1..6 {
            // Tokens of 2 distinct experts of 8, skewed towards low ids.
            let trace: Vec<Vec<u32>> = (0..300)
                .map(|_| {
                    let a = rnd(8).min(rnd(8));
                    let mut b = rnd(8);
                    while b == a {
                        b = rnd(8);
                    }
                    vec![a, b]
                })
                .collect();
            let best = belady(&trace, slots);
            for p in [
                Policy::Lru,
                Policy::Lfu { decay: 0.9 },
                Policy::Lfu { decay: 1.0 },
            ] {
                let h = simulate(&trace, 8, slots, p);
                assert!(
                    h <= best + 1e-12,
                    "{p} {h} > belady {best} at {slots} slots"
                );
            }
        }
    }

    #[test]
    fn policy_flag_parses() {
        assert_eq!("lru".parse::<Policy>(), Ok(Policy::Lru));
        assert_eq!("lfu:0.5".parse::<Policy>(), Ok(Policy::Lfu { decay: 0.5 }));
        assert!("lfu:0".parse::<Policy>().is_err());
        assert!("fifo".parse::<Policy>().is_err());
    }
}
