//! Per-conversation caches on the GPU.
//!
//! - Latent MLA cache, per layer: one row per position of `c_kv` (after `kv_a_layernorm`)
//!   and the rotated `k_pe` (576 values per token for GLM-5), in a [`LatentFormat`].
//! - Indexer key cache, per *full* layer only: one row per position of `index_head_dim`
//!   values (after `k_norm` and RoPE), in a [`KeyFormat`]. IndexShare layers have none.
//!
//! The row layouts and the kernels that write them are in [`crate::kernels::cache`].
//!
//! **Segments, allocated as the context grows.** Each layer's cache is a list of buffers
//! ([`Segment`]s): the first holds [`FIRST_SEGMENT`] positions, each next one as many as all
//! before it (so at most half of what is allocated is unused), none more than one storage
//! binding holds (so a layer's cache may be larger than a binding: lavapipe's and WebGPU's
//! 128 MiB, Metal's). A segment is allocated when the first position in it is written
//! ([`Caches::reserve`]): a short chat holds a few MB whatever `--ctx` says. The kernels
//! that read a cache take its segments ([`CacheRows`]) and read each with a dispatch of its
//! own.

use crate::config::{Config, IndexerKind};
use crate::error::{Error, Result};
use crate::gpu::Gpu;
pub use crate::kernels::cache::{CacheRows, KeyFormat, LatentFormat, Segment};

/// Positions in a layer's first segment (later ones double the total).
pub const FIRST_SEGMENT: usize = 4096;

/// Segment lengths are whole blocks of the indexer's key tiles.
const ALIGN: usize = 64;

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

/// The segment bounds of a cache of `max_ctx` positions whose segments hold at most `cap`
/// positions: `(lo, len)` each (see the module documentation).
fn segment_bounds(max_ctx: usize, cap: usize) -> Vec<(usize, usize)> {
    let cap = (cap / ALIGN * ALIGN).max(ALIGN);
    let mut out = Vec::new();
    let mut lo = 0;
    while lo < max_ctx {
        let want = if lo == 0 { FIRST_SEGMENT } else { lo };
        let len = want.min(cap).min((max_ctx - lo).div_ceil(ALIGN) * ALIGN);
        out.push((lo, len));
        lo += len;
    }
    out
}

/// A layer's cache: its segments so far.
struct LayerCache {
    segs: Vec<Segment>,
}

pub struct Caches {
    pub max_ctx: usize,
    pub format: CacheFormat,
    /// Positions held by the segments allocated so far.
    allocated: usize,
    latent_bounds: Vec<(usize, usize)>,
    key_bounds: Vec<(usize, usize)>,
    latent_words: usize,
    key_words: usize,
    latent: Vec<LayerCache>,
    keys: Vec<Option<LayerCache>>,
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
        let layer = || LayerCache { segs: Vec::new() };
        Ok(Caches {
            max_ctx,
            format,
            allocated: 0,
            latent_bounds: segment_bounds(max_ctx, seg_cap(lw)),
            key_bounds: segment_bounds(max_ctx, seg_cap(kw)),
            latent_words: lw,
            key_words: kw,
            latent: (0..cfg.num_hidden_layers).map(|_| layer()).collect(),
            keys: cfg
                .indexer_types
                .iter()
                .map(|k| matches!(k, IndexerKind::Full).then(layer))
                .collect(),
        })
    }

    /// Allocates the segments that positions `0 .. len` need (`len` ≤ `max_ctx`).
    pub fn reserve(&mut self, gpu: &Gpu, len: usize) -> Result<()> {
        if len <= self.allocated {
            return Ok(());
        }
        if len > self.max_ctx {
            return Err(Error::msg(format!(
                "the caches hold {} positions; {len} were asked for",
                self.max_ctx
            )));
        }
        let grow = |c: &mut LayerCache, bounds: &[(usize, usize)], words: usize, what: &str| {
            while let Some(&(lo, n)) = bounds.get(c.segs.len()).filter(|(lo, _)| *lo < len) {
                let bytes = (n * words * 4) as u64;
                let buf = gpu.buffer(bytes, &format!("{what} {lo}.."))?;
                c.segs.push(Segment {
                    buf,
                    lo: lo as u32,
                    len: n as u32,
                });
            }
            Ok::<(), Error>(())
        };
        for (i, c) in self.latent.iter_mut().enumerate() {
            grow(
                c,
                &self.latent_bounds,
                self.latent_words,
                &format!("latent cache {i}"),
            )?;
        }
        for (i, c) in self.keys.iter_mut().enumerate() {
            if let Some(c) = c {
                grow(
                    c,
                    &self.key_bounds,
                    self.key_words,
                    &format!("indexer keys {i}"),
                )?;
            }
        }
        // The cached bind groups name the buffers of the segments they bound; none is
        // dropped here, so they stay valid.
        self.allocated = self
            .latent_bounds
            .iter()
            .chain(&self.key_bounds)
            .filter(|(lo, _)| *lo < len)
            .map(|(lo, n)| lo + n)
            .min()
            .unwrap_or(len)
            .max(len)
            .min(self.max_ctx);
        Ok(())
    }

    /// Layer `i`'s latent cache, the segments that hold positions `0 .. n`.
    pub fn latent(&self, i: usize, n: usize) -> CacheRows<'_, LatentFormat> {
        rows(
            &self.latent[i].segs,
            n,
            self.format.latent,
            self.latent_words,
        )
    }

    /// Full layer `i`'s key cache, the segments that hold positions `0 .. n` (`None` on
    /// IndexShare layers).
    pub fn keys(&self, i: usize, n: usize) -> Option<CacheRows<'_, KeyFormat>> {
        let c = self.keys[i].as_ref()?;
        Some(rows(&c.segs, n, self.format.keys, self.key_words))
    }

    /// GPU bytes the caches take per token of context in `format`: a latent row on every
    /// layer and an indexer key row on every full layer.
    pub fn bytes_per_token(cfg: &Config, format: CacheFormat) -> u64 {
        let full = cfg
            .indexer_types
            .iter()
            .filter(|k| matches!(k, IndexerKind::Full))
            .count();
        ((cfg.num_hidden_layers * format.latent_words(cfg) + full * format.key_words(cfg)) * 4)
            as u64
    }

    /// The longest context whose caches fit in `bytes` of GPU memory in `format` (the
    /// segments' rounding aside). Not limited by the model's `max_position_embeddings`.
    pub fn max_ctx_for(cfg: &Config, format: CacheFormat, bytes: u64) -> usize {
        usize::try_from(bytes / Self::bytes_per_token(cfg, format).max(1)).unwrap_or(usize::MAX)
    }

    /// GPU bytes held by the caches (the segments allocated so far).
    pub fn bytes(&self) -> u64 {
        self.latent
            .iter()
            .chain(self.keys.iter().flatten())
            .flat_map(|c| &c.segs)
            .map(|s| s.buf.size())
            .sum()
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
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/sparsa-bard-12m");
        Config::from_dir(&dir).unwrap()
    }

    #[test]
    fn bytes_per_token_in_every_format() {
        let cfg = bard();
        // 8 layers x (64 + 16) values + 4 full indexer layers x 32 values.
        assert_eq!(
            Caches::bytes_per_token(&cfg, CacheFormat::F32),
            (8 * 80 + 4 * 32) * 4
        );
        // fp8: 64 codes + one scale + 16 bf16 = 16 + 1 + 8 words; i8 keys: 32 codes + scale.
        assert_eq!(
            Caches::bytes_per_token(&cfg, CacheFormat::SMALLEST),
            (8 * 25 + 4 * 9) * 4
        );
        assert_eq!(
            Caches::bytes_per_token(&cfg, CacheFormat::COMPACT),
            (8 * 25 + 4 * 16) * 4
        );
        assert_eq!(Caches::max_ctx_for(&cfg, CacheFormat::F32, 3072 * 100), 100);
    }

    #[test]
    fn auto_takes_the_most_precise_format_that_fits() {
        let cfg = bard();
        let at = |room| CacheFormat::auto(&cfg, 1000, room);
        assert_eq!(at(3072 * 1000), CacheFormat::F32);
        assert_eq!(at(3072 * 1000 - 1), CacheFormat::LADDER[1]);
        assert_eq!(at(1056 * 1000), CacheFormat::COMPACT);
        assert_eq!(at(944 * 1000), CacheFormat::SMALLEST);
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
    fn segments_double_and_respect_the_binding_cap() {
        assert_eq!(segment_bounds(100, 1 << 20), vec![(0, 128)]);
        assert_eq!(
            segment_bounds(20000, 1 << 20),
            vec![(0, 4096), (4096, 4096), (8192, 8192), (16384, 3648)]
        );
        // A cap of 5000 rows: segments of 4992 (whole blocks of 64) after the first.
        let b = segment_bounds(20000, 5000);
        assert_eq!(b[0], (0, 4096));
        assert!(b[1..].iter().all(|&(_, n)| n <= 4992 && n % 64 == 0));
        assert!(b.last().map(|(lo, n)| lo + n).unwrap() >= 20000);
    }
}
