//! Issue 22: the CPU expert executor allocates nothing per token. A counting allocator
//! (this test binary's global one) counts every allocation made while `run_experts` runs
//! (on any thread: the pool's workers too) after a first call has seen the sizes; the count
//! must be zero, in every stored format, for a decode step's shape (8 experts on one row)
//! and a prefill chunk's (experts on several rows, rows shared between experts), and for a
//! smaller call after a larger one.

use sparsa::experts::cpu::{run_experts, CpuExpert, CpuMatrix, Scratch};
use sparsa::experts::pool::Pool;
use sparsa::weights::quant::{quantize_fp8, quantize_rows};
use sparsa::weights::{DType, QFormat, WFormat};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static COUNT: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call goes to the system allocator; the counter only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            COUNT.fetch_add(1, Ordering::Relaxed);
        }
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            COUNT.fetch_add(1, Ordering::Relaxed);
        }
        System.realloc(p, l, size)
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// `[n, k]` random values stored in `format`: (weight bytes, scale bytes).
fn stored(format: WFormat, n: usize, k: usize, seed: &mut u64) -> (Vec<u8>, Vec<u8>) {
    let data: Vec<f32> = (0..n * k)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            (*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect();
    match format {
        WFormat::Quant(QFormat::Fp8) => quantize_fp8(&data, n, k),
        WFormat::Quant(q) => quantize_rows(q, &data, k),
        WFormat::Float(d) => (d.from_f32(&data), Vec::new()),
    }
}

#[test]
fn run_experts_allocates_nothing_once_it_has_seen_the_sizes() {
    // Awkward sizes: 288 = 9 chunks of 32 (an odd q4 pair count), inter 136 (past one FP8
    // block of 128).
    let (hidden, inter, experts) = (288usize, 136usize, 10usize);
    let pool = Pool::new(3, std::time::Duration::from_millis(1)).unwrap();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let xs: Vec<Vec<f32>> = (0..5)
        .map(|r| {
            (0..hidden)
                .map(|i| ((i * 7 + r * 3) % 23) as f32 / 11.0 - 1.0)
                .collect()
        })
        .collect();
    let rows: Vec<&[f32]> = xs.iter().map(|x| x.as_slice()).collect();
    for format in [
        WFormat::Quant(QFormat::Q4 { block: 32 }),
        WFormat::Quant(QFormat::Q8 { block: 32 }),
        WFormat::Quant(QFormat::Fp8),
        WFormat::Float(DType::BF16),
        WFormat::Float(DType::F16),
        WFormat::Float(DType::F32),
    ] {
        let mats: Vec<[(Vec<u8>, Vec<u8>); 3]> = (0..experts)
            .map(|_| {
                [
                    stored(format, inter, hidden, &mut seed),
                    stored(format, inter, hidden, &mut seed),
                    stored(format, hidden, inter, &mut seed),
                ]
            })
            .collect();
        let list: Vec<CpuExpert> = mats
            .iter()
            .map(|m| {
                let mat =
                    |j: usize, n, k| CpuMatrix::new("w", format, &m[j].0, &m[j].1, n, k).unwrap();
                CpuExpert::new(
                    "expert",
                    mat(0, inter, hidden),
                    mat(1, inter, hidden),
                    mat(2, hidden, inter),
                )
                .unwrap()
            })
            .collect();
        // A decode step's layer: 8 experts on one row. A prefill chunk's: 6 experts on 1 to
        // 5 rows, the rows shared between them. Then the decode step again, smaller.
        let decode: Vec<(CpuExpert, &[&[f32]])> = (0..8).map(|e| (list[e], &rows[..1])).collect();
        let chunk: Vec<(CpuExpert, &[&[f32]])> = (0..6)
            .map(|e| (list[e + 4], &rows[e % 2..e % 2 + 1 + e % 4]))
            .collect();
        let mut out = vec![0f32; 32 * hidden];
        let mut scratch = Scratch::default();
        for jobs in [&decode, &chunk] {
            run_experts(&pool, jobs, &mut out, &mut scratch);
        }
        let want = out.clone();
        for jobs in [&decode, &chunk, &decode] {
            COUNT.store(0, Ordering::SeqCst);
            COUNTING.store(true, Ordering::SeqCst);
            run_experts(&pool, jobs, &mut out, &mut scratch);
            COUNTING.store(false, Ordering::SeqCst);
            let n = COUNT.load(Ordering::SeqCst);
            assert_eq!(n, 0, "{format:?}: {n} allocations in a run_experts call");
        }
        // The same results as the first calls made (the chunk's, the last the first time).
        run_experts(&pool, &chunk, &mut out, &mut scratch);
        assert_eq!(out, want, "{format:?}: a repeated call changed the outputs");
    }
}
