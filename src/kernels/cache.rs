//! Cache row formats and the kernels that write them (`shaders/cache.wgsl`).
//!
//! A layer's latent cache holds one row per position, `kv_lora` values of `c_kv` then `dr`
//! of `k_pe`, as 32-bit words in a [`LatentFormat`]:
//! - `F32`: one word per value;
//! - `Bf16`: two values per word, the even one in the low half;
//! - `Fp8`: `kv_lora` e4m3 codes (four per word, the first in the low byte), one f32 scale
//!   per [`FP8_CACHE_BLOCK`] codes (the block's largest magnitude / 448), then the `dr` RoPE
//!   values in bf16: 656 bytes for GLM-5 and DeepSeek-V3.2 (512 + 4·4 + 64·2), the layout
//!   production DSA engines use.
//!
//! A full layer's indexer key cache holds one row of `dim` values per position, in a
//! [`KeyFormat`]: `F32`, `Bf16`, or `I8`: the key after a normalized Walsh–Hadamard rotation
//! (`dim` a power of two), as `dim` int8 codes (four per word) then one f32 scale (the row's
//! largest magnitude / 127): 132 bytes for a 128-value key. The rotation is orthogonal, so a
//! query rotated the same way ([`rotate`]) scores exactly as before rounding, while the
//! rotation spreads outlier channels over the row before it is rounded (the DeepSeek
//! reference does the same before its 8-bit indexer cache).
//!
//! The CPU conversions here ([`encode_latent`], [`decode_latent`], [`encode_key`],
//! [`decode_key`]) are the references the kernel tests compare against.

use super::rope::RopeSlice;
use super::{Causal, Recorder, View};
use crate::gpu::{kernel_params, u, Shader, ShaderCode};
use crate::weights::quant::{e4m3_to_f32, f32_to_e4m3, E4M3_MAX};

/// Codes per FP8 scale in a latent row.
pub const FP8_CACHE_BLOCK: usize = 128;
/// The longest key row the int8 format takes (the rotation runs in workgroup memory).
pub const MAX_I8_KEY_DIM: usize = 256;
/// The longest row a store prepares itself ([`Prepare`]; the row sits in workgroup memory).
pub const MAX_PREPARED_ROW: usize = 2048;

/// How a latent cache row is stored (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LatentFormat {
    F32,
    Bf16,
    Fp8,
}

/// How an indexer key row is stored (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyFormat {
    F32,
    Bf16,
    I8,
}

impl LatentFormat {
    pub const ALL: [LatentFormat; 3] = [LatentFormat::F32, LatentFormat::Bf16, LatentFormat::Fp8];

    pub fn name(self) -> &'static str {
        match self {
            LatentFormat::F32 => "f32",
            LatentFormat::Bf16 => "bf16",
            LatentFormat::Fp8 => "fp8",
        }
    }

    pub fn parse(s: &str) -> Option<LatentFormat> {
        Self::ALL.into_iter().find(|f| f.name() == s)
    }

    fn code(self) -> u32 {
        self as u32
    }

    /// 32-bit words per row of `kv_lora` + `dr` values.
    pub fn row_words(self, kv_lora: usize, dr: usize) -> usize {
        match self {
            LatentFormat::F32 => kv_lora + dr,
            LatentFormat::Bf16 => (kv_lora + dr).div_ceil(2),
            LatentFormat::Fp8 => kv_lora / 4 + kv_lora.div_ceil(FP8_CACHE_BLOCK) + dr.div_ceil(2),
        }
    }

    /// Why this format cannot hold rows of `kv_lora` + `dr` values, if it cannot.
    pub fn unsupported(self, kv_lora: usize, _dr: usize) -> Option<String> {
        (self == LatentFormat::Fp8 && !kv_lora.is_multiple_of(4)).then(|| {
            format!(
                "the fp8 latent cache needs kv_lora_rank to be a multiple of 4 (it is {kv_lora})"
            )
        })
    }
}

impl KeyFormat {
    pub const ALL: [KeyFormat; 3] = [KeyFormat::F32, KeyFormat::Bf16, KeyFormat::I8];

    pub fn name(self) -> &'static str {
        match self {
            KeyFormat::F32 => "f32",
            KeyFormat::Bf16 => "bf16",
            KeyFormat::I8 => "i8",
        }
    }

    pub fn parse(s: &str) -> Option<KeyFormat> {
        Self::ALL.into_iter().find(|f| f.name() == s)
    }

    fn code(self) -> u32 {
        self as u32
    }

    /// 32-bit words per key row of `dim` values.
    pub fn row_words(self, dim: usize) -> usize {
        match self {
            KeyFormat::F32 => dim,
            KeyFormat::Bf16 => dim.div_ceil(2),
            KeyFormat::I8 => dim.div_ceil(4) + 1,
        }
    }

    /// Why this format cannot hold keys of `dim` values, if it cannot.
    pub fn unsupported(self, dim: usize) -> Option<String> {
        (self == KeyFormat::I8 && !(dim.is_power_of_two() && (4..=MAX_I8_KEY_DIM).contains(&dim)))
            .then(|| {
                format!(
                    "the i8 indexer key cache rotates keys with a Walsh–Hadamard transform, which needs index_head_dim to be a power of two from 4 to {MAX_I8_KEY_DIM} (it is {dim})"
                )
            })
    }

    /// Whether queries must be rotated ([`rotate`]) before they score keys of this format.
    pub fn rotated(self) -> bool {
        self == KeyFormat::I8
    }
}

fn bf16_bits(x: f32) -> u32 {
    half::bf16::from_f32(x).to_bits() as u32
}

fn bf16_value(bits: u32) -> f32 {
    f32::from_bits(bits << 16)
}

fn pack_bytes(codes: &[u8], out: &mut [u32]) {
    for (w, c) in out.iter_mut().zip(codes.chunks(4)) {
        *w = c
            .iter()
            .enumerate()
            .fold(0, |a, (i, &b)| a | (b as u32) << (8 * i));
    }
}

fn pack_bf16(vals: &[f32], out: &mut [u32]) {
    for (w, p) in out.iter_mut().zip(vals.chunks(2)) {
        *w = bf16_bits(p[0]) | p.get(1).map_or(0, |&b| bf16_bits(b)) << 16;
    }
}

fn unpack_bf16(words: &[u32], n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| bf16_value((words[i / 2] >> (16 * (i % 2))) & 0xffff))
        .collect()
}

/// A latent row (`kv_lora` + `dr` values) in `fmt`.
pub fn encode_latent(fmt: LatentFormat, row: &[f32], kv_lora: usize) -> Vec<u32> {
    let dr = row.len() - kv_lora;
    let mut out = vec![0u32; fmt.row_words(kv_lora, dr)];
    match fmt {
        LatentFormat::F32 => out.iter_mut().zip(row).for_each(|(w, v)| *w = v.to_bits()),
        LatentFormat::Bf16 => pack_bf16(row, &mut out),
        LatentFormat::Fp8 => {
            let (lat, pe) = row.split_at(kv_lora);
            let mut codes = Vec::with_capacity(kv_lora);
            let nb = kv_lora.div_ceil(FP8_CACHE_BLOCK);
            for (b, block) in lat.chunks(FP8_CACHE_BLOCK).enumerate() {
                let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
                let scale = amax / E4M3_MAX;
                codes.extend(block.iter().map(|&v| {
                    if amax > 0.0 {
                        f32_to_e4m3(v / scale)
                    } else {
                        0
                    }
                }));
                out[kv_lora / 4 + b] = scale.to_bits();
            }
            pack_bytes(&codes, &mut out[..kv_lora / 4]);
            pack_bf16(pe, &mut out[kv_lora / 4 + nb..]);
        }
    }
    out
}

/// The values of a latent row stored in `fmt`.
pub fn decode_latent(fmt: LatentFormat, words: &[u32], kv_lora: usize, dr: usize) -> Vec<f32> {
    match fmt {
        LatentFormat::F32 => words[..kv_lora + dr]
            .iter()
            .map(|w| f32::from_bits(*w))
            .collect(),
        LatentFormat::Bf16 => unpack_bf16(words, kv_lora + dr),
        LatentFormat::Fp8 => {
            let nb = kv_lora.div_ceil(FP8_CACHE_BLOCK);
            let mut v: Vec<f32> = (0..kv_lora)
                .map(|c| {
                    let code = (words[c / 4] >> (8 * (c % 4))) as u8;
                    e4m3_to_f32(code) * f32::from_bits(words[kv_lora / 4 + c / FP8_CACHE_BLOCK])
                })
                .collect();
            v.extend(unpack_bf16(&words[kv_lora / 4 + nb..], dr));
            v
        }
    }
}

/// The normalized Walsh–Hadamard transform of `x` (length a power of two), in place.
pub fn hadamard(x: &mut [f32]) {
    let n = x.len();
    let mut h = 1;
    while h < n {
        for j in (0..n).step_by(2 * h) {
            for i in j..j + h {
                let (a, b) = (x[i], x[i + h]);
                x[i] = a + b;
                x[i + h] = a - b;
            }
        }
        h *= 2;
    }
    let norm = 1.0 / (n as f32).sqrt();
    x.iter_mut().for_each(|v| *v *= norm);
}

/// A key row in `fmt` (for `I8`, of the rotated key).
pub fn encode_key(fmt: KeyFormat, row: &[f32]) -> Vec<u32> {
    let dim = row.len();
    let mut out = vec![0u32; fmt.row_words(dim)];
    match fmt {
        KeyFormat::F32 => out.iter_mut().zip(row).for_each(|(w, v)| *w = v.to_bits()),
        KeyFormat::Bf16 => pack_bf16(row, &mut out),
        KeyFormat::I8 => {
            let mut x = row.to_vec();
            hadamard(&mut x);
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            let scale = amax / 127.0;
            let codes: Vec<u8> = x
                .iter()
                .map(|&v| {
                    if amax > 0.0 {
                        (v / scale).round_ties_even().clamp(-127.0, 127.0) as i8 as u8
                    } else {
                        0
                    }
                })
                .collect();
            pack_bytes(&codes, &mut out[..dim / 4]);
            out[dim / 4] = scale.to_bits();
        }
    }
    out
}

/// The values of a key row stored in `fmt` (for `I8`, the rotated key).
pub fn decode_key(fmt: KeyFormat, words: &[u32], dim: usize) -> Vec<f32> {
    match fmt {
        KeyFormat::F32 => words[..dim].iter().map(|w| f32::from_bits(*w)).collect(),
        KeyFormat::Bf16 => unpack_bf16(words, dim),
        KeyFormat::I8 => {
            let scale = f32::from_bits(words[dim / 4]);
            (0..dim)
                .map(|c| (words[c / 4] >> (8 * (c % 4))) as u8 as i8 as f32 * scale)
                .collect()
        }
    }
}

/// One buffer of a layer's cache: the rows of positions `lo .. lo + len`.
#[derive(Clone)]
pub struct Segment {
    pub buf: wgpu::Buffer,
    pub lo: u32,
    pub len: u32,
}

/// A layer's cache as the kernels read it: consecutive segments (the first from position
/// 0; each but the last a whole number of 64-position blocks), rows of `row_words` words in
/// `format`. Only the segments a kernel may read need be listed.
#[derive(Clone, Copy)]
pub struct CacheRows<'a, F> {
    pub segs: &'a [Segment],
    pub format: F,
    pub row_words: u32,
}

kernel_params! {
    struct Params {
        src_off: u32,
        src_stride: u32,
        dst_off: u32,
        row_words: u32,
        rows: u32,
        /// Position of the dispatch's first row.
        pos0: u32,
        /// First position of the segment written.
        seg_lo: u32,
        kv_lora: u32,
        dr: u32,
        /// Values per row: a key row's (store_keys), a vector's (rotate), kv_lora + dr
        /// (store_latent).
        dim: u32,
        /// Vectors per row (rotate).
        heads: u32,
        seed: u32,
        /// Prepared rows (see [`Prepare`]): the norm's length, 1 for LayerNorm, its eps.
        norm_dim: u32,
        layer_norm: u32,
        eps: f32,
        /// Prepared rows: the RoPE pairs (as [`RopeSlice`] names them, one head) and the
        /// cos/sin row of the dispatch's first row.
        rot_off: u32,
        rot_half: u32,
        interleave: u32,
        cs_row: u32,
        /// Rows say where they sit (places.wgsl, [`super::Causal::places`]): row r's cache
        /// row is its lo + pos; those outside this segment (`seg_lo ..` `seg_len` rows) are
        /// skipped.
        ragged: u32,
        seg_len: u32,
        _pad0: u32,
        _pad1: u32,
    }
}

const CACHE: Shader<Params> = Shader::new(
    "cache",
    concat!(
        include_str!("../../shaders/fp8.wgsl"),
        include_str!("../../shaders/reduce.wgsl"),
        include_str!("../../shaders/rotary.wgsl"),
        include_str!("../../shaders/places.wgsl"),
        include_str!("../../shaders/cache.wgsl")
    ),
);

/// This module's shaders (for [`super::shaders`]).
pub(super) const SHADERS: &[ShaderCode] = &[CACHE.code()];

/// Where the rows written come from: a chunk's f32 rows, the same rows normalized and
/// rotated by the store itself, or seeded pseudo-random values of unit variance (synthetic
/// caches for benchmarks).
#[derive(Clone, Copy)]
pub enum Source<'a> {
    Rows(View<'a>),
    Prepared(Prepare<'a>),
    Random(u32),
}

/// Rows the store normalizes and rotates before encoding them, in the same dispatch (what
/// a norm, a RoPE and the store did in three): row `r` of `rows`, its first `norm_dim`
/// values through RMSNorm with `weight` (LayerNorm with `weight` and `bias` where `bias` is
/// given; `eps`), then the dims `rope` names rotated (its `heads` is 1, `rot_off` counted
/// from the row's start) with row `r` of `cos_sin` (laid out as [`super::rope::rope`] takes
/// it). Rows of at most [`MAX_PREPARED_ROW`] values.
#[derive(Clone, Copy)]
pub struct Prepare<'a> {
    pub rows: View<'a>,
    pub norm_dim: u32,
    pub weight: &'a wgpu::Buffer,
    pub bias: Option<&'a wgpu::Buffer>,
    pub eps: f32,
    pub rope: &'a RopeSlice,
    pub cos_sin: &'a wgpu::Buffer,
}

/// cache.wgsl's workgroup size (CWG): [`super::reduce_workgroup`] of 128 where `small`, else
/// 128 (FP8 latents, whose workgroup quantizes a 128-code block at a time).
fn workgroup(gpu: &crate::gpu::Gpu, small: bool) -> u32 {
    match small {
        true => super::reduce_workgroup(gpu, 128),
        false => 128,
    }
}

/// Dispatches `entry` once per segment that positions `pos0 .. pos0 + rows` touch, or with
/// places ([`Causal::places`]) for every row on every segment (`defines`: LFMT, KFMT and
/// CWG; every pipeline of cache.wgsl sets all five defines).
fn store<F: Copy>(
    rec: &mut Recorder,
    entry: &'static str,
    defines: &[(&'static str, String)],
    src: Source,
    cache: &CacheRows<F>,
    at: Causal,
    base: Params,
) {
    let Causal {
        rows, pos0, places, ..
    } = at;
    if rows == 0 {
        return;
    }
    let n_values = base.dim;
    let gpu = rec.gpu();
    let (random, seed, sv, prep) = match src {
        Source::Rows(v) => (0u32, 0, Some(v), None),
        Source::Prepared(p) => (0, 0, Some(p.rows), Some(p)),
        Source::Random(seed) => (1, seed, None, None),
    };
    let mut defs = defines.to_vec();
    defs.push(("RANDOM", u(random)));
    defs.push(("PREP", u(prep.is_some() as u32)));
    let base = match prep {
        Some(p) => {
            assert!(
                n_values as usize <= MAX_PREPARED_ROW && p.norm_dim <= n_values,
                "{entry}: a prepared row of {n_values} values (at most {MAX_PREPARED_ROW}), normalized over {}",
                p.norm_dim
            );
            assert!(
                p.rope.heads == 1 && p.rope.rot_off + p.rope.rot_dim <= n_values,
                "{entry}: the prepared row's RoPE dims lie outside its {n_values} values"
            );
            Params {
                norm_dim: p.norm_dim,
                layer_norm: p.bias.is_some() as u32,
                eps: p.eps,
                rot_off: p.rope.rot_off,
                rot_half: p.rope.rot_dim / 2,
                interleave: p.rope.interleave as u32,
                ..base
            }
        }
        None => base,
    };
    let p = gpu.pipeline(&CACHE, entry, &defs);
    let dummy = gpu.dummy();
    let side = match prep {
        Some(p) => [p.weight, p.bias.unwrap_or(dummy), p.cos_sin],
        None => [dummy; 3],
    };
    let (ragged, places_buf) = at.places_binding(gpu);
    assert!(
        places.is_none() || random == 0,
        "{entry}: synthetic rows have no places"
    );
    let end = pos0 + rows;
    for seg in cache.segs {
        // The rows this segment's dispatch takes (from chunk row r, n of them): with places
        // every row (the kernel skips those outside the segment), else the rows whose
        // positions fall in it.
        let (r, n) = if places.is_some() {
            (0, rows)
        } else {
            let (lo, hi) = (pos0.max(seg.lo), end.min(seg.lo + seg.len));
            if lo >= hi {
                continue;
            }
            (lo - pos0, hi - lo)
        };
        let params = Params {
            src_off: sv.map_or(0, |v| v.offset + r * v.stride),
            src_stride: sv.map_or(0, |v| v.stride),
            dst_off: 0,
            row_words: cache.row_words,
            rows: n,
            pos0: pos0 + r,
            seg_lo: seg.lo,
            seg_len: seg.len,
            ragged,
            seed,
            cs_row: r,
            ..base
        };
        rec.cost(n as u64 * cache.row_words as u64 * 4 * 2, 0, "");
        let srcb = sv.map_or(dummy, |v| v.buf);
        let bufs = [srcb, &seg.buf, side[0], side[1], side[2], places_buf];
        rec.dispatch(&p, &params, &bufs, gpu.grid(n));
    }
    let covered = cache.segs.last().map_or(0, |s| s.lo + s.len);
    assert!(
        places.is_some() || end <= covered,
        "{entry}: positions up to {end} written, the cache's segments hold {covered}"
    );
}

/// Writes latent rows (`kv_lora` + `dr` values each) for positions `pos0 .. pos0 + rows`
/// (`at`: `(pos0, rows)`, or a [`Causal`] with places: each row at its cache row) into
/// `cache`, in its format.
pub fn store_latent<'a>(
    rec: &mut Recorder,
    src: Source,
    cache: &CacheRows<LatentFormat>,
    at: impl Into<Causal<'a>>,
    (kv_lora, dr): (u32, u32),
) {
    let base = Params {
        kv_lora,
        dr,
        dim: kv_lora + dr,
        ..bytemuck::Zeroable::zeroed()
    };
    let small = cache.format != LatentFormat::Fp8;
    let defs = [
        ("LFMT", u(cache.format.code())),
        ("KFMT", u(0u32)),
        ("CWG", u(workgroup(rec.gpu(), small))),
    ];
    store(rec, "store_latent", &defs, src, cache, at.into(), base);
}

/// Writes indexer key rows (`dim` values each) for positions `pos0 .. pos0 + rows` (`at`:
/// as [`store_latent`] takes it) into `cache`, in its format (rotated first for `I8`).
pub fn store_keys<'a>(
    rec: &mut Recorder,
    src: Source,
    cache: &CacheRows<KeyFormat>,
    at: impl Into<Causal<'a>>,
    dim: u32,
) {
    let base = Params {
        dim,
        ..bytemuck::Zeroable::zeroed()
    };
    let defs = [
        ("LFMT", u(0u32)),
        ("KFMT", u(cache.format.code())),
        ("CWG", u(workgroup(rec.gpu(), true))),
    ];
    store(rec, "store_keys", &defs, src, cache, at.into(), base);
}

/// The normalized Walsh–Hadamard rotation, in place, of each of the `heads` vectors of
/// `dim` values in each of `x`'s `rows` rows (`dim` a power of two ≤ [`MAX_I8_KEY_DIM`]).
pub fn rotate(rec: &mut Recorder, x: View, rows: u32, heads: u32, dim: u32) {
    if rows == 0 || heads == 0 {
        return;
    }
    let gpu = rec.gpu();
    let p = gpu.pipeline(
        &CACHE,
        "rotate",
        &[
            ("RANDOM", u(0u32)),
            ("PREP", u(0u32)),
            ("LFMT", u(0u32)),
            ("KFMT", u(0u32)),
            ("CWG", u(workgroup(gpu, true))),
        ],
    );
    let params = Params {
        src_off: x.offset,
        src_stride: x.stride,
        rows,
        heads,
        dim,
        ..bytemuck::Zeroable::zeroed()
    };
    let n = rows as u64 * heads as u64;
    assert!(n <= u32::MAX as u64, "rotate: too many vectors");
    rec.cost(8 * n * dim as u64, 0, "");
    rec.dispatch(&p, &params, &[x.buf], gpu.grid(n as u32));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::rope::rope_ref;
    use crate::kernels::testutil::{assert_close, gpu, Rng};

    /// Rows with a few outlier channels, as real latent rows and keys have.
    fn rows(rng: &mut Rng, n: usize, width: usize) -> Vec<f32> {
        let mut v = rng.vec(n * width, 1.0);
        for r in 0..n {
            v[r * width + (r * 7) % width] *= 30.0;
        }
        if n > 2 {
            // An all-zero row: scale 0, codes 0.
            v[width..2 * width].iter_mut().for_each(|x| *x = 0.0);
        }
        v
    }

    #[test]
    fn cpu_codecs_round_trip_within_their_precision() {
        let mut rng = Rng::new(3);
        let (kl, dr) = (512, 64);
        let row = rows(&mut rng, 1, kl + dr);
        for fmt in LatentFormat::ALL {
            let w = encode_latent(fmt, &row, kl);
            assert_eq!(w.len(), fmt.row_words(kl, dr));
            let back = decode_latent(fmt, &w, kl, dr);
            let amax = row[..kl].iter().fold(0f32, |m, v| m.max(v.abs()));
            for (i, (a, b)) in back.iter().zip(&row).enumerate() {
                let tol = match fmt {
                    LatentFormat::F32 => 0.0,
                    LatentFormat::Bf16 => b.abs() / 256.0,
                    // e4m3: 3 mantissa bits, and the block's subnormal step.
                    LatentFormat::Fp8 if i < kl => b.abs() / 16.0 + amax / 448.0 / 512.0,
                    LatentFormat::Fp8 => b.abs() / 256.0,
                };
                assert!((a - b).abs() <= tol, "{fmt:?} element {i}: {a} vs {b}");
            }
        }
        assert_eq!(LatentFormat::Fp8.row_words(512, 64) * 4, 656);
        let key = rows(&mut rng, 1, 128);
        let mut rot = key.clone();
        hadamard(&mut rot);
        let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm(&rot) - norm(&key)).abs() < 1e-3 * norm(&key));
        let w = encode_key(KeyFormat::I8, &key);
        assert_eq!(w.len() * 4, 132);
        let back = decode_key(KeyFormat::I8, &w, 128);
        let step = f32::from_bits(w[32]);
        for (a, b) in back.iter().zip(&rot) {
            assert!((a - b).abs() <= step * 0.5 + 1e-6);
        }
        // Rotating twice is the identity (the normalized transform is its own inverse).
        hadamard(&mut rot);
        assert_close(&rot, &key, 1e-4, 1e-4, "hadamard twice");
    }

    /// Cache rows of `segs` segments read back as words.
    fn read_segments(segs: &[Segment], row_words: usize) -> Vec<u32> {
        let g = gpu();
        let mut out = Vec::new();
        for s in segs {
            out.extend(g.read_u32(&s.buf, 0, s.len as usize * row_words).unwrap());
        }
        out
    }

    /// Empty segments of `seg_len` rows holding `n` rows in all.
    fn empty_segments(n: usize, seg_len: usize, row_words: usize) -> Vec<Segment> {
        (0..n.div_ceil(seg_len))
            .map(|i| Segment {
                buf: gpu()
                    .buffer((seg_len * row_words * 4) as u64, "segment")
                    .unwrap(),
                lo: (i * seg_len) as u32,
                len: seg_len as u32,
            })
            .collect()
    }

    /// Compares decoded rows: at most one code step apart (the GPU divides by the scale
    /// with its own rounding, so a value on a rounding boundary may round the other way).
    fn check_rows(got: &[f32], want: &[f32], step: &[f32], what: &str) {
        for (i, ((g, w), s)) in got.iter().zip(want).zip(step).enumerate() {
            assert!(
                (g - w).abs() <= s * 1.0001 + 1e-6,
                "{what}: element {i}: GPU {g}, CPU {w} (step {s})"
            );
        }
    }

    #[test]
    fn store_latent_matches_the_cpu_codec_across_segments() {
        // Both workgroup sizes (CWG): the GPUs' 128 and the CPU adapters' 8.
        for cpu in [false, true] {
            crate::kernels::with_cpu_kernels(
                cpu,
                store_latent_matches_the_cpu_codec_across_segments_on,
            );
        }
    }

    fn store_latent_matches_the_cpu_codec_across_segments_on() {
        let g = gpu();
        let mut rng = Rng::new(11);
        // kv_lora not a multiple of 128 (a partial scale block), odd dr.
        for &(kl, dr) in &[(200usize, 9usize), (64, 16), (512, 64)] {
            for fmt in LatentFormat::ALL {
                let words = fmt.row_words(kl, dr);
                let segs = empty_segments(15, 5, words);
                // Rows for positions 3 .. 14: they straddle all three segments.
                let (pos0, n) = (3u32, 11usize);
                let src = rows(&mut rng, n, kl + dr);
                let sb = g.buffer_from(&src, "src").unwrap();
                let cache = CacheRows {
                    segs: &segs,
                    format: fmt,
                    row_words: words as u32,
                };
                let mut rec = g.recorder();
                let v = View::rows(&sb, (kl + dr) as u32);
                store_latent(
                    &mut rec,
                    Source::Rows(v),
                    &cache,
                    (pos0, n as u32),
                    (kl as u32, dr as u32),
                );
                rec.finish().unwrap();
                let all = read_segments(&segs, words);
                for r in 0..n {
                    let p = pos0 as usize + r;
                    let got = decode_latent(fmt, &all[p * words..(p + 1) * words], kl, dr);
                    let row = &src[r * (kl + dr)..(r + 1) * (kl + dr)];
                    let want_w = encode_latent(fmt, row, kl);
                    let want = decode_latent(fmt, &want_w, kl, dr);
                    let step = latent_step(fmt, &want, &want_w, kl);
                    check_rows(
                        &got,
                        &want,
                        &step,
                        &format!("{fmt:?} kv_lora {kl} dr {dr} position {p}"),
                    );
                }
            }
        }
    }

    #[test]
    fn store_keys_and_rotate_match_the_cpu_codec() {
        // Both workgroup sizes (CWG): the GPUs' 128 and the CPU adapters' 8.
        for cpu in [false, true] {
            crate::kernels::with_cpu_kernels(cpu, store_keys_and_rotate_match_the_cpu_codec_on);
        }
    }

    fn store_keys_and_rotate_match_the_cpu_codec_on() {
        let g = gpu();
        let mut rng = Rng::new(12);
        for &dim in &[4usize, 32, 128, 256] {
            for fmt in KeyFormat::ALL {
                let words = fmt.row_words(dim);
                let n = 70usize;
                let segs = empty_segments(128, 64, words);
                let src = rows(&mut rng, n, dim);
                let sb = g.buffer_from(&src, "src").unwrap();
                let cache = CacheRows {
                    segs: &segs,
                    format: fmt,
                    row_words: words as u32,
                };
                let mut rec = g.recorder();
                store_keys(
                    &mut rec,
                    Source::Rows(View::rows(&sb, dim as u32)),
                    &cache,
                    (0, n as u32),
                    dim as u32,
                );
                rec.finish().unwrap();
                let all = read_segments(&segs, words);
                for r in 0..n {
                    let got = decode_key(fmt, &all[r * words..(r + 1) * words], dim);
                    let want_w = encode_key(fmt, &src[r * dim..(r + 1) * dim]);
                    let want = decode_key(fmt, &want_w, dim);
                    let step = match fmt {
                        KeyFormat::I8 => f32::from_bits(want_w[dim / 4]) + 1e-5,
                        _ => 0.0,
                    };
                    check_rows(
                        &got,
                        &want,
                        &vec![step; dim],
                        &format!("{fmt:?} dim {dim} row {r}"),
                    );
                }
            }
            // rotate: every head of every row, in place.
            let (rows_n, heads) = (3u32, 5u32);
            let x = rng.vec(rows_n as usize * heads as usize * dim + 7, 1.0);
            let xb = g.buffer_from(&x, "x").unwrap();
            let mut rec = g.recorder();
            rotate(
                &mut rec,
                View::new(&xb, 7, heads * dim as u32),
                rows_n,
                heads,
                dim as u32,
            );
            rec.finish().unwrap();
            let got = g.read_f32(&xb, 0, x.len()).unwrap();
            let mut want = x.clone();
            for v in want[7..].chunks_mut(dim) {
                hadamard(v);
            }
            assert_close(&got, &want, 1e-5, 1e-4, &format!("rotate dim {dim}"));
        }
    }

    /// Row `r` of `src` as a prepared store computes it: the first `norm_dim` values
    /// through RMSNorm (LayerNorm with `bias`), then RoPE on `rope`'s dims.
    fn prepared_ref(
        row: &[f32],
        norm_dim: usize,
        (w, bias): (&[f32], Option<&[f32]>),
        rope: &RopeSlice,
        cs: &[f32],
    ) -> Vec<f32> {
        let eps = 1e-6f64;
        let x: Vec<f64> = row.iter().map(|&v| v as f64).collect();
        let n = norm_dim as f64;
        let mean = match bias {
            Some(_) => x[..norm_dim].iter().sum::<f64>() / n,
            None => 0.0,
        };
        let var = x[..norm_dim]
            .iter()
            .map(|v| (v - mean).powi(2))
            .sum::<f64>()
            / n;
        let scale = 1.0 / (var + eps).sqrt();
        let mut y: Vec<f32> = row.to_vec();
        for c in 0..norm_dim {
            y[c] = ((x[c] - mean) * scale * w[c] as f64 + bias.map_or(0.0, |b| b[c] as f64)) as f32;
        }
        rope_ref(&mut y, 1, row.len(), rope, cs);
        y
    }

    /// The tolerance per value of a latent row decoded from the cache: an FP8 code's
    /// rounding step (relative 1/8 of the value, plus its block's scale / 512) on the first
    /// `kl` values of an FP8 row, else 0.
    fn latent_step(f: LatentFormat, want: &[f32], want_w: &[u32], kl: usize) -> Vec<f32> {
        (0..want.len())
            .map(|c| match f {
                LatentFormat::Fp8 if c < kl => {
                    want[c].abs() / 8.0 + f32::from_bits(want_w[kl / 4 + c / 128]) / 512.0
                }
                _ => 0.0,
            })
            .collect()
    }

    /// A prepared store (norm + RoPE + store in one dispatch) writes what the CPU writes
    /// for the normalized, rotated rows: latent rows (RMSNorm over kv_lora, RoPE on the
    /// last dr) and key rows (LayerNorm, RoPE on the first dr), every format, both
    /// pairings, rows straddling segments.
    #[test]
    fn prepared_stores_normalize_and_rotate() {
        // Both workgroup sizes (CWG): the GPUs' 128 and the CPU adapters' 8.
        for cpu in [false, true] {
            crate::kernels::with_cpu_kernels(cpu, prepared_stores_normalize_and_rotate_on);
        }
    }

    fn prepared_stores_normalize_and_rotate_on() {
        let g = gpu();
        let mut rng = Rng::new(13);
        let (pos0, n) = (3u32, 11usize);
        // (values per row, normalized, RoPE from, RoPE dims, interleave, key row)
        let cases = [
            (210usize, 200usize, 200usize, 10usize, false, false),
            (80, 64, 64, 16, true, false),
            (576, 512, 512, 64, true, false),
            (32, 32, 0, 8, true, true),
            (128, 128, 0, 64, false, true),
        ];
        for &(width, norm_dim, rot_off, rot_dim, interleave, key) in &cases {
            // Key rows far from zero mean: a LayerNorm without its mean would show.
            let shift = if key { 3.0 } else { 0.0 };
            let src: Vec<f32> = rows(&mut rng, n, width + 5)
                .into_iter()
                .map(|v| v + shift)
                .collect();
            let w: Vec<f32> = (0..norm_dim).map(|_| 1.0 + 0.5 * rng.uniform()).collect();
            let b = rng.vec(norm_dim, 0.3);
            let half = rot_dim / 2;
            let cs = rng.cos_sin(n, half);
            let (sb, wb, bb) = (
                g.buffer_from(&src, "src").unwrap(),
                g.buffer_from(&w, "w").unwrap(),
                g.buffer_from(&b, "b").unwrap(),
            );
            let csb = g.buffer_from(&cs, "cos_sin").unwrap();
            let rope = RopeSlice {
                heads: 1,
                head_stride: width as u32,
                rot_off: rot_off as u32,
                rot_dim: rot_dim as u32,
                interleave,
            };
            // Rows start 2 values into each row of the source (a view into a wider row).
            let prep = Prepare {
                rows: View::new(&sb, 2, (width + 5) as u32),
                norm_dim: norm_dim as u32,
                weight: &wb,
                bias: key.then_some(&bb),
                eps: 1e-6,
                rope: &rope,
                cos_sin: &csb,
            };
            let formats: Vec<(usize, u32)> = if key {
                KeyFormat::ALL
                    .iter()
                    .map(|f| (f.row_words(width), f.code()))
                    .collect()
            } else {
                let kl = norm_dim;
                LatentFormat::ALL
                    .iter()
                    .map(|f| (f.row_words(kl, width - kl), f.code()))
                    .collect()
            };
            for (fi, &(words, _)) in formats.iter().enumerate() {
                let store_to = |at: Causal| {
                    let segs = empty_segments(15, 5, words);
                    let mut rec = g.recorder();
                    if key {
                        let cache = CacheRows {
                            segs: &segs,
                            format: KeyFormat::ALL[fi],
                            row_words: words as u32,
                        };
                        let src = Source::Prepared(prep);
                        store_keys(&mut rec, src, &cache, at, width as u32);
                    } else {
                        let cache = CacheRows {
                            segs: &segs,
                            format: LatentFormat::ALL[fi],
                            row_words: words as u32,
                        };
                        let dims = (norm_dim as u32, (width - norm_dim) as u32);
                        let src = Source::Prepared(prep);
                        store_latent(&mut rec, src, &cache, at, dims);
                    }
                    rec.finish().unwrap();
                    read_segments(&segs, words)
                };
                let all = store_to((pos0, n as u32).into());
                // The same rows with places (a batched step's): row r to cache row lo + pos,
                // spread over the segments out of order; bit for bit what the plain store
                // wrote at pos0 + r, and nothing else written.
                let host: Vec<(u32, u32)> = (0..n as u32)
                    .map(|r| (if r % 2 == 0 { 4 } else { 0 }, n as u32 - 1 - r))
                    .collect();
                let pw: Vec<u32> = host.iter().flat_map(|&(lo, p)| [lo, p]).collect();
                let places = g.buffer_from(&pw, "places").unwrap();
                let placed = store_to(Causal {
                    places: Some(&places),
                    ..Causal::chunk(n as u32, n as u32, 0)
                });
                let mut untouched = [true; 15];
                for (r, &(lo, p)) in host.iter().enumerate() {
                    let (d, s) = ((lo + p) as usize, pos0 as usize + r);
                    untouched[d] = false;
                    assert_eq!(
                        &placed[d * words..(d + 1) * words],
                        &all[s * words..(s + 1) * words],
                        "placed row {r} at cache row {d} (key {key}, format {fi})"
                    );
                }
                for (d, _) in untouched.iter().enumerate().filter(|u| *u.1) {
                    assert!(placed[d * words..(d + 1) * words].iter().all(|&w| w == 0));
                }
                for r in 0..n {
                    let raw = &src[r * (width + 5) + 2..][..width];
                    let bias = key.then_some(&b[..]);
                    let row = prepared_ref(raw, norm_dim, (&w, bias), &rope, &cs[r * 2 * half..]);
                    let p = pos0 as usize + r;
                    let stored = &all[p * words..(p + 1) * words];
                    let (got, want, step) = if key {
                        let f = KeyFormat::ALL[fi];
                        let want_w = encode_key(f, &row);
                        let step = match f {
                            KeyFormat::I8 => f32::from_bits(want_w[width / 4]) + 1e-5,
                            _ => 0.0,
                        };
                        (
                            decode_key(f, stored, width),
                            decode_key(f, &want_w, width),
                            vec![step; width],
                        )
                    } else {
                        let (f, kl, dr) = (LatentFormat::ALL[fi], norm_dim, width - norm_dim);
                        let want_w = encode_latent(f, &row, kl);
                        let want = decode_latent(f, &want_w, kl, dr);
                        let step = latent_step(f, &want, &want_w, kl);
                        (decode_latent(f, stored, kl, dr), want, step)
                    };
                    // Float rounding of the norm (reduction order) and of bf16 ties: a
                    // relative 1e-5, or one bf16 step.
                    let step: Vec<f32> = step
                        .iter()
                        .zip(&want)
                        .map(|(s, w)| {
                            s.max(w.abs() / 128.0 * (fi == 1) as u32 as f32) + w.abs() * 1e-5
                        })
                        .collect();
                    check_rows(
                        &got,
                        &want,
                        &step,
                        &format!("prepared width {width} format {fi} key {key} position {p}"),
                    );
                }
            }
        }
    }

    #[test]
    fn random_rows_have_unit_variance_in_every_format() {
        let g = gpu();
        let (kl, dr, n) = (64usize, 16usize, 256u32);
        for fmt in LatentFormat::ALL {
            let words = fmt.row_words(kl, dr);
            let segs = empty_segments(n as usize, n as usize, words);
            let cache = CacheRows {
                segs: &segs,
                format: fmt,
                row_words: words as u32,
            };
            let mut rec = g.recorder();
            store_latent(
                &mut rec,
                Source::Random(5),
                &cache,
                (0, n),
                (kl as u32, dr as u32),
            );
            rec.finish().unwrap();
            let all = read_segments(&segs, words);
            let vals: Vec<f32> = all
                .chunks(words)
                .flat_map(|w| decode_latent(fmt, w, kl, dr))
                .collect();
            let var = vals.iter().map(|v| v * v).sum::<f32>() / vals.len() as f32;
            assert!((0.9..1.1).contains(&var), "{fmt:?}: variance {var}");
        }
    }
}
