//! Per-conversation caches on the GPU.
//!
//! - Latent MLA cache, per layer: one row per position of `c_kv` (after `kv_a_layernorm`)
//!   and the rotated `k_pe` (576 values per token for GLM-5), in a [`LatentFormat`].
//! - Indexer key cache, per *full* layer only: one row per position of `index_head_dim`
//!   values (after `k_norm` and RoPE), in a [`KeyFormat`]. IndexShare layers have none.
//!
//! The row layouts and the kernels that write them are in [`crate::kernels::cache`].
//!
//! **Grown as the context grows.** Each layer's cache is a list of buffers ([`Segment`]s)
//! of at most one storage binding each (so a layer's cache may be larger than a binding:
//! lavapipe's and WebGPU's 128 MiB, Metal's), the last one partly used. The last segment
//! starts at [`FIRST_SEGMENT`] positions and doubles when a write needs more: a new buffer,
//! the old rows copied over, the old one dropped, one layer at a time ([`Caches::reserve`]).
//! A short chat holds a few MB whatever `--ctx` says, at most half of what is allocated is
//! unused, the copies cost one extra write per position over a whole conversation, and a
//! context within one binding is one buffer: the kernels that read a cache take its
//! segments ([`CacheRows`]) and read each with a dispatch of its own.
//!
//! **Pooled for batching.** [`Caches::pool`] gives several sessions one buffer per layer,
//! allocated at once, each session a region of it (its position 0 at cache row
//! [`Caches::lo`]): the kernels then take rows of all of them in one dispatch, each row
//! saying where it sits ([`crate::kernels::Causal::places`]), which a batched decode step
//! across sequences needs (`sparsa serve`).

use crate::config::Config;
use crate::error::{Error, Result};
use crate::gpu::Gpu;
pub use crate::kernels::cache::{CacheRows, KeyFormat, LatentFormat, Segment};

/// Positions a layer's cache starts with (it doubles as needed).
pub const FIRST_SEGMENT: usize = 4096;

/// Segment lengths are whole blocks of the indexer's key tiles.
const ALIGN: usize = crate::kernels::indexer::KT as usize;

/// The cache formats of a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CacheFormat {
    pub latent: LatentFormat,
    pub keys: KeyFormat,
}

impl CacheFormat {
    pub const F32: CacheFormat = CacheFormat {
        latent: LatentFormat::F32,
        keys: KeyFormat::F32,
    };

    /// FP8 latent rows and bf16 indexer keys (656 + 256 bytes per token and full layer for
    /// GLM-5): of the formats measured on the built-in model (docs/CACHE.md), the smallest
    /// whose greedy tokens stay transformers' and whose held-out perplexity moves by under
    /// 0.3 %.
    pub const COMPACT: CacheFormat = CacheFormat {
        latent: LatentFormat::Fp8,
        keys: KeyFormat::Bf16,
    };

    /// The smallest formats: FP8 latent rows, int8 rotated indexer keys (656 + 132 bytes per
    /// token and full layer for GLM-5), for the longest contexts; measured in docs/CACHE.md.
    pub const SMALLEST: CacheFormat = CacheFormat {
        latent: LatentFormat::Fp8,
        keys: KeyFormat::I8,
    };

    /// From most to least precise: what [`CacheFormat::auto`] tries in turn.
    pub const LADDER: [CacheFormat; 4] = [
        CacheFormat::F32,
        CacheFormat {
            latent: LatentFormat::Bf16,
            keys: KeyFormat::Bf16,
        },
        CacheFormat::COMPACT,
        CacheFormat::SMALLEST,
    ];

    /// The default: the most precise formats of [`Self::LADDER`] whose caches for `ctx`
    /// positions fit in `room` bytes, else the smallest. f32 caches wherever they fit keep
    /// every output equal to transformers' f32 runs (the goldens, the built-in model's
    /// greedy tokens); the compact ones make long contexts fit, at the quality loss
    /// docs/CACHE.md measures. Formats the model's shapes cannot take are skipped.
    pub fn auto(cfg: &Config, ctx: usize, room: u64) -> CacheFormat {
        let ok: Vec<CacheFormat> = Self::LADDER
            .into_iter()
            .filter(|f| f.check(cfg).is_ok())
            .collect();
        ok.iter()
            .copied()
            .find(|f| Caches::bytes_per_token(cfg, *f).saturating_mul(ctx as u64) <= room)
            .or(ok.last().copied())
            .unwrap_or(CacheFormat::F32)
    }

    /// `f32`, `bf16` (both parts bf16), `fp8` ([`Self::COMPACT`]), or `LATENT/KEYS` with
    /// LATENT one of f32, bf16, fp8 and KEYS one of f32, bf16, i8.
    pub fn parse(s: &str) -> Option<CacheFormat> {
        match s {
            "f32" => return Some(CacheFormat::F32),
            "bf16" => return Some(Self::LADDER[1]),
            "fp8" => return Some(CacheFormat::COMPACT),
            _ => {}
        }
        let (l, k) = s.split_once('/')?;
        Some(CacheFormat {
            latent: LatentFormat::parse(l)?,
            keys: KeyFormat::parse(k)?,
        })
    }

    /// Why `cfg`'s caches cannot be stored in these formats, if they cannot.
    pub fn check(&self, cfg: &Config) -> Result<()> {
        let why = self
            .latent
            .unsupported(cfg.kv_lora_rank, cfg.qk_rope_head_dim)
            .or_else(|| self.keys.unsupported(cfg.index_head_dim));
        match why {
            Some(w) => Err(Error::msg(format!("--cache-type: {w}"))),
            None => Ok(()),
        }
    }

    /// `latent/keys`, e.g. `fp8/i8`.
    pub fn name(&self) -> String {
        format!("{}/{}", self.latent.name(), self.keys.name())
    }

    fn latent_words(&self, cfg: &Config) -> usize {
        self.latent
            .row_words(cfg.kv_lora_rank, cfg.qk_rope_head_dim)
    }

    fn key_words(&self, cfg: &Config) -> usize {
        self.keys.row_words(cfg.index_head_dim)
    }
}

/// The segment lengths a cache needs to hold positions `0 .. need` (`need` ≤ `max_ctx`),
/// with segments of at most `cap` positions (see the module documentation): whole segments
/// of `cap`, then one of the power of two (≥ [`FIRST_SEGMENT`]) that holds the rest, both
/// cut at `max_ctx` (rounded up to whole key blocks).
fn segment_lens(max_ctx: usize, cap: usize, need: usize) -> Vec<usize> {
    let cap = (cap / ALIGN * ALIGN).max(ALIGN);
    let end = max_ctx.div_ceil(ALIGN) * ALIGN;
    let mut out = Vec::new();
    let mut lo = 0;
    while lo < need.max(1) {
        let rest = need.max(1) - lo;
        let len = if rest >= cap {
            cap
        } else {
            rest.next_power_of_two().max(FIRST_SEGMENT)
        };
        let len = len.min(cap).min(end - lo);
        out.push(len);
        lo += len;
    }
    out
}

/// Brings a layer's segments `segs` to `lens` (segments are only added or lengthened). A
/// lengthened segment is a new buffer with the old rows copied over; the old buffer is
/// dropped before the wait, so its memory is free before the next layer grows.
fn grow(
    gpu: &Gpu,
    segs: &mut Vec<Segment>,
    lens: &[usize],
    words: usize,
    what: &str,
) -> Result<()> {
    let mut lo = 0;
    for (k, &len) in lens.iter().enumerate() {
        let have = segs.get(k).map_or(0, |s| s.len as usize);
        if have < len {
            let bytes = (len * words * 4) as u64;
            let buf = gpu.buffer(bytes, &format!("{what} {lo}..{}", lo + len))?;
            let seg = Segment {
                buf,
                lo: lo as u32,
                len: len as u32,
            };
            match segs.get_mut(k) {
                Some(old) => {
                    let mut rec = gpu.recorder();
                    rec.copy(&old.buf, 0, &seg.buf, 0, old.buf.size());
                    rec.flush();
                    *old = seg;
                    rec.finish()?;
                }
                None => segs.push(seg),
            }
        }
        lo += len;
    }
    Ok(())
}

pub struct Caches {
    pub max_ctx: usize,
    pub format: CacheFormat,
    /// Positions held by the segments allocated so far.
    allocated: usize,
    /// Positions one storage binding holds, for latent and key rows.
    latent_cap: usize,
    key_cap: usize,
    latent_words: usize,
    key_words: usize,
    /// Each layer's segments so far; keys on full layers only.
    latent: Vec<Vec<Segment>>,
    keys: Vec<Option<Vec<Segment>>>,
    /// Pooled ([`Caches::pool`]): the cache row of position 0, the pool's id and how many
    /// sessions share it. Else 0, 0, 1.
    lo: usize,
    pool: u64,
    sharers: usize,
    /// Different for every `Caches` made and after every growth: what a recording of
    /// dispatches that bind these buffers checks before it is replayed
    /// ([`Caches::generation`]).
    generation: u64,
}

/// A number no `Caches` had before ([`Caches::generation`]).
fn fresh_generation() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl Caches {
    /// Caches for up to `max_ctx` positions in `format`; nothing is allocated until
    /// [`Caches::reserve`].
    pub fn new(gpu: &Gpu, cfg: &Config, max_ctx: usize, format: CacheFormat) -> Result<Caches> {
        format.check(cfg)?;
        let (lw, kw) = (format.latent_words(cfg), format.key_words(cfg));
        let seg_cap = |words: usize| (gpu.max_binding() / (4 * words.max(1) as u64)) as usize;
        if seg_cap(lw).max(seg_cap(kw)) < ALIGN {
            return Err(Error::msg(format!(
                "the adapter's storage binding limit ({} bytes) holds fewer than {ALIGN} cache rows",
                gpu.max_binding()
            )));
        }
        Ok(Caches {
            max_ctx,
            format,
            allocated: 0,
            latent_cap: seg_cap(lw),
            key_cap: seg_cap(kw),
            latent_words: lw,
            key_words: kw,
            latent: (0..cfg.cache_layers()).map(|_| Vec::new()).collect(),
            keys: (0..cfg.cache_layers())
                .map(|i| cfg.has_keys(i).then(Vec::new))
                .collect(),
            lo: 0,
            pool: 0,
            sharers: 1,
            generation: fresh_generation(),
        })
    }

    /// Caches for `n` sessions of up to `max_ctx` positions each, sharing one buffer per
    /// layer (session `i`'s position 0 at cache row `i · max_ctx`, rounded up to key blocks),
    /// allocated now. `None` when a layer's pool would not fit one storage binding (the
    /// kernels read a pooled cache as one segment).
    pub fn pool(
        gpu: &Gpu,
        cfg: &Config,
        max_ctx: usize,
        n: usize,
        format: CacheFormat,
    ) -> Result<Option<Vec<Caches>>> {
        let region = max_ctx.div_ceil(ALIGN) * ALIGN;
        let total = region
            .checked_mul(n.max(1))
            .filter(|t| u32::try_from(*t).is_ok());
        let mut all = Caches::new(gpu, cfg, total.unwrap_or(usize::MAX), format)?;
        let Some(total) = total.filter(|t| *t <= all.latent_cap.min(all.key_cap)) else {
            return Ok(None);
        };
        all.reserve(gpu, total)?;
        static POOLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let pool = POOLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let region_of = |i: usize| Caches {
            max_ctx,
            format,
            allocated: max_ctx,
            latent: all.latent.clone(),
            keys: all.keys.clone(),
            lo: i * region,
            pool,
            sharers: n,
            generation: fresh_generation(),
            ..all
        };
        Ok(Some((0..n).map(region_of).collect()))
    }

    /// The cache row of position 0 (0 but in a pool).
    pub fn lo(&self) -> usize {
        self.lo
    }

    /// Whether positions `0 .. len` are already held (a [`Caches::reserve`] of `len` would
    /// not grow them).
    pub fn holds(&self, len: usize) -> bool {
        len <= self.allocated
    }

    /// Changes whenever the buffers these caches bind may have: a recording that binds them
    /// (`gpu::Recording`) is replayed only while this is what it was recorded under.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether `self` and `other` are regions of one pool (their rows can share a dispatch).
    pub fn same_pool(&self, other: &Caches) -> bool {
        self.pool != 0 && self.pool == other.pool
    }

    /// Makes room for positions `0 .. len` (`len` ≤ `max_ctx`): new segments, and a last
    /// segment that is too short grown into a buffer twice its size (or more) with its rows
    /// copied over. Growing waits for the GPU once per layer, so no more than one layer's
    /// old buffer is alive beside the new ones.
    pub fn reserve(&mut self, gpu: &Gpu, len: usize) -> Result<()> {
        if len <= self.allocated {
            return Ok(());
        }
        if len > self.max_ctx || self.pool != 0 {
            return Err(Error::msg(format!(
                "the caches hold {} positions; {len} were asked for",
                self.max_ctx
            )));
        }
        let latent_lens = segment_lens(self.max_ctx, self.latent_cap, len);
        let key_lens = segment_lens(self.max_ctx, self.key_cap, len);
        // Cached bind groups hold the buffers they name: drop them first, or every old
        // segment would stay alive until all layers have grown (1.5x the caches at once).
        gpu.clear_bind_groups();
        self.generation = fresh_generation();
        for (i, c) in self.latent.iter_mut().enumerate() {
            let what = format!("latent cache {i}");
            grow(gpu, c, &latent_lens, self.latent_words, &what)?;
        }
        for (i, c) in self.keys.iter_mut().enumerate() {
            if let Some(c) = c {
                let what = format!("indexer keys {i}");
                grow(gpu, c, &key_lens, self.key_words, &what)?;
            }
        }
        let held = |lens: &[usize]| lens.iter().sum::<usize>();
        self.allocated = held(&latent_lens).min(held(&key_lens)).min(self.max_ctx);
        Ok(())
    }

    /// Layer `i`'s latent cache, the segments that hold positions `0 .. n` (cache rows
    /// from [`Caches::lo`]).
    pub fn latent(&self, i: usize, n: usize) -> CacheRows<'_, LatentFormat> {
        rows(
            &self.latent[i],
            self.lo + n,
            self.format.latent,
            self.latent_words,
        )
    }

    /// Full layer `i`'s key cache, the segments that hold positions `0 .. n` (`None` on
    /// IndexShare layers).
    pub fn keys(&self, i: usize, n: usize) -> Option<CacheRows<'_, KeyFormat>> {
        let c = self.keys[i].as_ref()?;
        Some(rows(c, self.lo + n, self.format.keys, self.key_words))
    }

    /// GPU bytes the caches take per token of context in `format`: a latent row on every
    /// layer and an indexer key row on every full layer (the MTP layer counted, where the
    /// model runs one).
    pub fn bytes_per_token(cfg: &Config, format: CacheFormat) -> u64 {
        let layers = cfg.cache_layers();
        let full = (0..layers).filter(|i| cfg.has_keys(*i)).count();
        ((layers * format.latent_words(cfg) + full * format.key_words(cfg)) * 4) as u64
    }

    /// The longest context whose caches fit in `bytes` of GPU memory in `format` (the
    /// segments' rounding aside). Not limited by the model's `max_position_embeddings`.
    pub fn max_ctx_for(cfg: &Config, format: CacheFormat, bytes: u64) -> usize {
        usize::try_from(bytes / Self::bytes_per_token(cfg, format).max(1)).unwrap_or(usize::MAX)
    }

    /// GPU bytes held by the caches (the segments allocated so far; in a pool, this
    /// session's share).
    pub fn bytes(&self) -> u64 {
        let all: u64 = self
            .latent
            .iter()
            .chain(self.keys.iter().flatten())
            .flatten()
            .map(|s| s.buf.size())
            .sum();
        all / self.sharers as u64
    }
}

/// The segments of `segs` that hold positions below `n` (at least the first).
fn rows<F>(segs: &[Segment], n: usize, format: F, words: usize) -> CacheRows<'_, F> {
    let used = segs
        .iter()
        .take_while(|s| (s.lo as usize) < n.max(1))
        .count();
    CacheRows {
        segs: &segs[..used],
        format,
        row_words: words as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bard() -> Config {
        let dir = crate::config::bard_dir();
        Config::from_dir(&dir).unwrap()
    }

    #[test]
    fn bytes_per_token_in_every_format() {
        let cfg = bard();
        // 8 layers and the MTP layer x (64 + 16) values + 4 full indexer layers and the
        // MTP layer's indexer x 32 values.
        assert_eq!(
            Caches::bytes_per_token(&cfg, CacheFormat::F32),
            (9 * 80 + 5 * 32) * 4
        );
        // fp8: 64 codes + one scale + 16 bf16 = 16 + 1 + 8 words; i8 keys: 32 codes + scale.
        assert_eq!(
            Caches::bytes_per_token(&cfg, CacheFormat::SMALLEST),
            (9 * 25 + 5 * 9) * 4
        );
        assert_eq!(
            Caches::bytes_per_token(&cfg, CacheFormat::COMPACT),
            (9 * 25 + 5 * 16) * 4
        );
        assert_eq!(Caches::max_ctx_for(&cfg, CacheFormat::F32, 3520 * 100), 100);
    }

    #[test]
    fn segments_double_and_respect_the_binding_cap() {
        assert_eq!(segment_lens(100, 1 << 20, 1), vec![128]);
        assert_eq!(segment_lens(20000, 1 << 20, 1), vec![4096]);
        assert_eq!(segment_lens(20000, 1 << 20, 4097), vec![8192]);
        assert_eq!(segment_lens(20000, 1 << 20, 9000), vec![16384]);
        assert_eq!(segment_lens(20000, 1 << 20, 16385), vec![20096]);
        // A cap of 5000 rows: whole segments of 4992 (whole blocks of 128), then the rest.
        assert_eq!(segment_lens(20000, 5000, 12000), vec![4992, 4992, 4096]);
        assert_eq!(
            segment_lens(20000, 5000, 20000),
            vec![4992, 4992, 4992, 4992, 128]
        );
    }

    #[test]
    fn auto_takes_the_most_precise_format_that_fits() {
        let cfg = bard();
        let at = |room| CacheFormat::auto(&cfg, 1000, room);
        assert_eq!(at(3520 * 1000), CacheFormat::F32);
        assert_eq!(at(3520 * 1000 - 1), CacheFormat::LADDER[1]);
        assert_eq!(at(1220 * 1000), CacheFormat::COMPACT);
        assert_eq!(at(1080 * 1000), CacheFormat::SMALLEST);
        assert_eq!(at(0), CacheFormat::SMALLEST);
        for (s, f) in [
            ("f32", CacheFormat::F32),
            ("fp8", CacheFormat::COMPACT),
            ("fp8/i8", CacheFormat::SMALLEST),
        ] {
            assert_eq!(CacheFormat::parse(s), Some(f));
            assert_eq!(CacheFormat::parse(&f.name()), Some(f));
        }
        assert_eq!(CacheFormat::parse("fp8/fp8"), None);
        assert_eq!(CacheFormat::parse("q4"), None);
    }

    #[test]
    fn growing_keeps_the_rows_written() {
        use crate::kernels::cache::{store_keys, store_latent, Source};
        let g = crate::kernels::testutil::gpu();
        let cfg = bard();
        let mut c = Caches::new(g, &cfg, 10000, CacheFormat::COMPACT).unwrap();
        c.reserve(g, 100).unwrap();
        assert_eq!(c.latent(0, 100).segs[0].len as usize, FIRST_SEGMENT);
        let (kl, dr, id) = (64, 16, 32);
        let mut rec = g.recorder();
        store_latent(
            &mut rec,
            Source::Random(3),
            &c.latent(0, 100),
            (0, 100),
            (kl, dr),
        );
        store_keys(
            &mut rec,
            Source::Random(4),
            &c.keys(0, 100).unwrap(),
            (0, 100),
            id,
        );
        rec.finish().unwrap();
        let read = |c: &Caches| {
            let l = c.latent(0, 100);
            let k = c.keys(0, 100).unwrap();
            (
                g.read_u32(&l.segs[0].buf, 0, 100 * l.row_words as usize)
                    .unwrap(),
                g.read_u32(&k.segs[0].buf, 0, 100 * k.row_words as usize)
                    .unwrap(),
            )
        };
        let before = read(&c);
        let held = c.bytes();
        // A reserve within what is held keeps the buffers, and so the generation that
        // recordings binding them are replayed under; a growth changes it.
        let generation = c.generation();
        assert!(c.holds(4000) && !c.holds(9000));
        c.reserve(g, 4000).unwrap();
        assert_eq!(c.generation(), generation);
        c.reserve(g, 9000).unwrap();
        assert_ne!(c.generation(), generation);
        // 16384 positions would pass --ctx: cut at 10000, rounded up to a key block.
        assert_eq!(c.latent(0, 9000).segs[0].len, 10112);
        assert_eq!(c.bytes() * 4096, held * 10112);
        assert_eq!(read(&c), before, "rows written before the growth");
        assert!(c.reserve(g, 10001).is_err());
    }
}
