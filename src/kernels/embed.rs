//! Embedding gather (`shaders/embed.wgsl`).
use super::{Recorder, View};
use crate::gpu::{kernel_params, u, Shader, ShaderCode};
use crate::weights::GpuWeight;

kernel_params! {
    struct Params {
        ids_off: u32,
        n: u32,
        dim: u32,
        row0: u32,
        crow: u32,
        vocab: u32,
        out_off: u32,
        out_stride: u32,
        last: u32,
        _pad0: u32,
        _pad1: u32,
        _pad2: u32,
    }
}

const EMBED: Shader<Params> = Shader::new(
    "embed",
    concat!(
        include_str!("../../shaders/weights.wgsl"),
        include_str!("../../shaders/embed.wgsl")
    ),
);

/// This module's shaders (for [`super::shaders`]).
pub(super) const SHADERS: &[ShaderCode] = &[EMBED.code()];

/// `out[t, :] = table[ids[ids_off + t], :]` as f32, for `t < n`. `table` is `[vocab, dim]`
/// in any [`crate::weights::DType`] and may be split into chunks (one dispatch per chunk;
/// each writes the rows whose id falls in that chunk). Ids ≥ vocab write zeros.
pub fn embed(
    rec: &mut Recorder,
    table: &GpuWeight,
    ids: &wgpu::Buffer,
    ids_off: u32,
    n: u32,
    out: View,
) {
    debug_assert!(
        ids != out.buf,
        "embed: ids and out must be different buffers"
    );
    if n == 0 || table.cols == 0 {
        return;
    }
    let gpu = rec.gpu();
    let pipe = gpu.pipeline(&EMBED, "embed", &[("W_DTYPE", u(table.format.code()))]);
    let grid = gpu.grid(n);
    let last = table.chunks.len().saturating_sub(1);
    for (i, c) in table.chunks.iter().enumerate() {
        let p = Params {
            ids_off,
            n,
            dim: table.cols as u32,
            row0: c.row0 as u32,
            crow: c.rows as u32,
            vocab: table.rows as u32,
            out_off: out.offset,
            out_stride: out.stride,
            last: (i == last) as u32,
            _pad0: 0,
            _pad1: 0,
            _pad2: 0,
        };
        rec.dispatch(&pipe, &p, &[&c.buf, ids, out.buf], grid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testutil::{assert_close, gpu, Rng};
    use crate::weights::DType;

    const SENTINEL: f32 = 4321.0;

    fn check(seed: u64, vocab: usize, dim: usize, n: usize, dtype: DType, chunk: Option<usize>) {
        let g = gpu();
        let mut rng = Rng::new(seed);
        let table = rng.vec(vocab * dim, 2.0);
        let tr = dtype.to_f32(&dtype.from_f32(&table));
        let wgt = GpuWeight::from_f32(g, &table, vocab, dim, dtype, chunk, "embed").unwrap();
        if chunk.is_some() {
            assert!(wgt.chunks.len() > 1, "chunking not exercised");
        }
        let ids_off = 4usize;
        let mut ids: Vec<u32> = (0..ids_off + n)
            .map(|_| rng.below(vocab as u64) as u32)
            .collect();
        // Out-of-vocabulary ids, the first and last rows.
        ids[ids_off] = vocab as u32;
        if n > 1 {
            ids[ids_off + 1] = u32::MAX;
        }
        if n > 2 {
            ids[ids_off + 2] = vocab as u32 - 1;
            ids[ids_off + n - 1] = 0;
        }
        let (o_off, o_stride) = (6usize, dim + 3);
        let olen = o_off + n * o_stride + 2;
        let ib = g.buffer_from(&ids, "ids").unwrap();
        let ob = g.buffer_from(&vec![SENTINEL; olen], "out").unwrap();
        let mut rec = g.recorder();
        embed(
            &mut rec,
            &wgt,
            &ib,
            ids_off as u32,
            n as u32,
            View::new(&ob, o_off as u32, o_stride as u32),
        );
        rec.finish().unwrap();
        let got = g.read_f32(&ob, 0, olen).unwrap();
        let mut want = vec![SENTINEL; olen];
        for t in 0..n {
            let id = ids[ids_off + t] as usize;
            let dst = &mut want[o_off + t * o_stride..][..dim];
            if id < vocab {
                dst.copy_from_slice(&tr[id * dim..][..dim]);
            } else {
                dst.fill(0.0);
            }
        }
        assert_close(
            &got,
            &want,
            0.0,
            0.0,
            &format!("embed vocab={vocab} dim={dim} n={n} {dtype:?} chunk={chunk:?}"),
        );
    }

    #[test]
    fn embed_all_dtypes() {
        for (i, dtype) in [DType::F32, DType::BF16, DType::F16]
            .into_iter()
            .enumerate()
        {
            let s = i as u64 * 10;
            check(s, 37, 131, 1, dtype, None);
            check(s + 1, 37, 577, 29, dtype, None);
            // Odd dims: every other 16-bit row starts mid-word.
            check(s + 2, 37, 131, 29, dtype, Some(5));
            check(s + 3, 50, 7, 300, dtype, Some(7));
            check(s + 4, 11, 300, 5, dtype, Some(1));
        }
    }
}
