//! Random weights for the shape examples (`gemv_shapes`, `gemm_shapes`): made on the
//! device from deterministic bytes, in q4, q8 or bf16.
use sparsa::gpu::Gpu;
use sparsa::weights::quant::QFormat;
use sparsa::weights::{DType, GpuWeight};

/// Deterministic bytes (xorshift), so no host f32 copy of a large matrix is needed.
fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

pub fn weight(gpu: &Gpu, fmt: &str, rows: usize, cols: usize) -> sparsa::Result<GpuWeight> {
    weight_in_chunks(gpu, fmt, rows, cols, None)
}

/// [`weight`] in chunks of at most `chunk_rows` rows where given: stacked experts, which a
/// chunk must not split.
pub fn weight_in_chunks(
    gpu: &Gpu,
    fmt: &str,
    rows: usize,
    cols: usize,
    chunk_rows: Option<usize>,
) -> sparsa::Result<GpuWeight> {
    let q = |f: QFormat| {
        let w = bytes(rows * f.file_row_bytes(cols), 7);
        // bf16 scales of about 0.01 (0x3c24), never NaN.
        let s: Vec<u8> = (0..rows * cols.div_ceil(f.block()))
            .flat_map(|_| [0x24u8, 0x3c])
            .collect();
        GpuWeight::upload_quant_raw(gpu, &w, &s, rows, cols, f, chunk_rows, "w")
    };
    match fmt {
        "q4" => q(QFormat::Q4 { block: 32 }),
        "q8" => q(QFormat::Q8 { block: 32 }),
        _ => {
            // bf16 of small normal values: exponent byte 0x3c or 0x3d, any mantissa.
            let mut b = bytes(rows * cols * 2, 9);
            for (i, v) in b.iter_mut().enumerate() {
                if i % 2 == 1 {
                    *v = 0x3c | (*v & 0x81);
                }
            }
            GpuWeight::upload_bytes(
                gpu,
                &[&b],
                rows,
                cols,
                DType::BF16,
                1,
                chunk_rows,
                ("w", false),
            )
        }
    }
}
