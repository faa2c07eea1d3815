//! The values: a counter-based generator of each tensor's rows, their bytes in every storage
//! format (bf16, f32, FP8 e4m3 with block scales, q8 / q4), and the worker pool that produces
//! row blocks ahead of the writer.

use super::tensors::{Init, Store, Tensor};
use crate::error::{Error, Result};
use crate::weights::quant::{quantize_rows, E4M3_MAX, FP8_BLOCK};
use crate::weights::QFormat;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};

// ---------------------------------------------------------------------------------------
// Random values.

pub(super) fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

pub(super) fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The values of one row into `out` (`cols` of them): wyrand seeded by (seed, name, row).
fn gen_row(init: Init, key: u64, row: usize, out: &mut [f32]) {
    match init {
        Init::Const(c) => out.fill(c),
        Init::Uniform(a) => {
            let mut s = splitmix64(key ^ splitmix64(row as u64));
            let scale = 2.0 * a / (1u32 << 24) as f32;
            let mut next = || {
                s = s.wrapping_add(0xa076_1d64_78bd_642f);
                let t = (s as u128).wrapping_mul((s ^ 0xe703_7ed1_a0b4_28db) as u128);
                ((t >> 64) ^ t) as u64
            };
            let mut pairs = out.chunks_exact_mut(2);
            for p in &mut pairs {
                let r = next();
                p[0] = ((r >> 40) as f32 + 0.5) * scale - a;
                p[1] = (((r >> 8) & 0xFF_FFFF) as f32 + 0.5) * scale - a;
            }
            if let [x] = pairs.into_remainder() {
                *x = ((next() >> 40) as f32 + 0.5) * scale - a;
            }
        }
    }
}

/// Nearest e4m3fn code (round to nearest even, saturating at ±448): the same result as
/// [`crate::weights::quant::f32_to_e4m3`], computed from the float's bits.
fn e4m3(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = x.abs();
    if a.is_nan() {
        return 0x7F;
    }
    if a >= E4M3_MAX {
        return sign | 0x7E;
    }
    if a < 1.0 / 64.0 {
        // Subnormals m · 2⁻⁹ (m = 8 is the smallest normal, code 0x08).
        return sign | (a * 512.0).round_ties_even() as u8;
    }
    let bits = a.to_bits();
    let r = (bits + 0x7_FFFF + ((bits >> 20) & 1)) & !0xF_FFFF;
    let e = (r >> 23) as i32 - 127 + 7;
    let code = ((e as u32) << 3) | ((r >> 20) & 7);
    sign | code.min(0x7E) as u8
}

/// The FP8 scale of a block with largest magnitude `amax`: amax / 448, or (ue8m0) the
/// smallest power of two ≥ that.
fn fp8_scale(amax: f32, ue8m0: bool) -> f32 {
    if amax <= 0.0 || !amax.is_finite() {
        return 1.0;
    }
    let s = amax / E4M3_MAX;
    if !ue8m0 {
        return s;
    }
    let bits = s.to_bits();
    if bits & 0x7F_FFFF == 0 {
        s
    } else {
        f32::from_bits(((bits >> 23) + 1) << 23)
    }
}

/// Rows per generated block of a tensor: a 128-row FP8 block, else about 256K values.
pub(super) fn block_rows(t: &Tensor) -> usize {
    match t.store {
        Store::Fp8 | Store::Fp8ScaleInv => FP8_BLOCK,
        _ => ((1usize << 18) / t.cols.max(1)).clamp(1, 128),
    }
}

/// The bytes of rows `r0 .. r0 + n` of tensor `t` (scale tensors: the scales of those rows).
pub(super) fn gen_block(
    t: &Tensor,
    key: u64,
    r0: usize,
    n: usize,
    format: Option<QFormat>,
    ue8m0: bool,
) -> Vec<u8> {
    let k = t.cols;
    let mut row = vec![0f32; k];
    match t.store {
        Store::Bf16 | Store::F32 => {
            let es = if t.store == Store::F32 { 4 } else { 2 };
            let mut out = Vec::with_capacity(n * k * es);
            for r in r0..r0 + n {
                gen_row(t.init, key, r, &mut row);
                if t.store == Store::F32 {
                    out.extend(row.iter().flat_map(|x| x.to_le_bytes()));
                } else {
                    out.extend(
                        row.iter()
                            .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes()),
                    );
                }
            }
            out
        }
        Store::Quant | Store::QuantScale => {
            let fmt = format.unwrap_or(QFormat::Q8 { block: 32 });
            let mut v = vec![0f32; n * k];
            for (i, r) in (r0..r0 + n).enumerate() {
                gen_row(t.init, key, r, &mut v[i * k..(i + 1) * k]);
            }
            let (w, s) = quantize_rows(fmt, &v, k);
            if t.store == Store::Quant {
                w
            } else {
                s
            }
        }
        Store::Fp8 | Store::Fp8ScaleInv => {
            // One 128-row block row: amax per 128 columns, then (weights) a second pass
            // that regenerates each row and encodes it (no f32 copy of the block is kept).
            let nbk = k.div_ceil(FP8_BLOCK);
            let mut amax = vec![0f32; nbk];
            for r in r0..r0 + n {
                gen_row(t.init, key, r, &mut row);
                for (b, blk) in row.chunks(FP8_BLOCK).enumerate() {
                    amax[b] = blk.iter().fold(amax[b], |m, x| m.max(x.abs()));
                }
            }
            let scales: Vec<f32> = amax.iter().map(|a| fp8_scale(*a, ue8m0)).collect();
            if t.store == Store::Fp8ScaleInv {
                return scales.iter().flat_map(|s| s.to_le_bytes()).collect();
            }
            let mut out = Vec::with_capacity(n * k);
            for r in r0..r0 + n {
                gen_row(t.init, key, r, &mut row);
                for (blk, s) in row.chunks(FP8_BLOCK).zip(&scales) {
                    out.extend(blk.iter().map(|x| e4m3(x / s)));
                }
            }
            out
        }
    }
}

// ---------------------------------------------------------------------------------------
// Writing.

/// Blocks produced ahead of the writer, shared by the workers.
pub(super) struct Pool {
    pub(super) next: AtomicUsize,
    pub(super) state: Mutex<PoolState>,
    pub(super) produced: Condvar,
    pub(super) consumed: Condvar,
}

pub(super) struct PoolState {
    pub(super) ready: HashMap<usize, Vec<u8>>,
    /// Jobs the writer has taken (all jobs below this index).
    pub(super) taken: usize,
    pub(super) stop: bool,
    pub(super) failed: bool,
}

impl Pool {
    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn stop(&self) {
        self.lock().stop = true;
        self.produced.notify_all();
        self.consumed.notify_all();
    }

    /// The bytes of job `j`, waiting for a worker to finish it.
    pub(super) fn take(&self, j: usize) -> Result<Vec<u8>> {
        let mut st = self.lock();
        loop {
            if let Some(b) = st.ready.remove(&j) {
                st.taken = j + 1;
                drop(st);
                self.consumed.notify_all();
                return Ok(b);
            }
            if st.failed {
                return Err(Error::msg("internal error: a generator thread failed"));
            }
            st = self.produced.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    pub(super) fn work(&self, jobs: usize, window: usize, run: &(dyn Fn(usize) -> Vec<u8> + Sync)) {
        loop {
            let j = self.next.fetch_add(1, Ordering::Relaxed);
            if j >= jobs {
                return;
            }
            {
                let mut st = self.lock();
                while j >= st.taken + window && !st.stop {
                    st = self.consumed.wait(st).unwrap_or_else(|e| e.into_inner());
                }
                if st.stop {
                    return;
                }
            }
            let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(j)));
            let mut st = self.lock();
            match out {
                Ok(b) => {
                    st.ready.insert(j, b);
                }
                Err(_) => {
                    st.failed = true;
                    st.stop = true;
                }
            }
            drop(st);
            self.produced.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::quant::{e4m3_to_f32, f32_to_e4m3};

    #[test]
    fn fast_e4m3_matches_the_reference_encoder() {
        // Every code, the midpoints between neighbours (ties) and a sweep of magnitudes.
        let mut xs: Vec<f32> = Vec::new();
        for c in 0u8..=0x7E {
            let v = e4m3_to_f32(c);
            xs.push(v);
            let next = e4m3_to_f32(c + 1);
            if next.is_finite() {
                xs.push((v + next) / 2.0);
                xs.push(v + (next - v) * 0.49);
                xs.push(v + (next - v) * 0.51);
            }
        }
        let mut s = 1u64;
        for _ in 0..20000 {
            s = splitmix64(s);
            let y = f32::from_bits((s as u32) & 0x7FFF_FFFF);
            if y.is_finite() {
                xs.push(y % 600.0);
            }
            xs.push((s >> 40) as f32 / (1u64 << 24) as f32 * 0.05);
        }
        xs.extend([448.0, 449.0, 464.0, 1e9, 0.0, 1e-30]);
        for x in xs {
            for v in [x, -x] {
                assert_eq!(e4m3(v), f32_to_e4m3(v), "{v}");
            }
        }
    }

    #[test]
    fn ue8m0_scales_are_powers_of_two_covering_amax() {
        for amax in [1e-3f32, 0.0377, 1.0, 448.0, 896.0, 3.3e4] {
            let s = fp8_scale(amax, true);
            assert_eq!(s.to_bits() & 0x7F_FFFF, 0, "{s}");
            assert!(amax / s <= 448.0 && amax / s > 224.0, "{amax} {s}");
        }
        assert_eq!(fp8_scale(448.0, false), 1.0);
    }

    #[test]
    fn rows_do_not_depend_on_blocking() {
        let mut a = vec![0f32; 301];
        let mut b = vec![0f32; 301];
        gen_row(Init::Uniform(0.5), 7, 3, &mut a);
        gen_row(Init::Uniform(0.5), 7, 3, &mut b);
        assert_eq!(a, b);
        gen_row(Init::Uniform(0.5), 7, 4, &mut b);
        assert_ne!(a, b);
        assert!(a.iter().all(|x| x.abs() < 0.5));
        let mean = a.iter().sum::<f32>() / a.len() as f32;
        let var = a.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / a.len() as f32;
        // Uniform(−0.5, 0.5): variance 1/12.
        assert!((var - 1.0 / 12.0).abs() < 0.02, "{var}");
    }
}
