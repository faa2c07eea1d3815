//! Embedding gather (`shaders/embed.wgsl`).
use super::{Recorder, View};
use crate::gpu::{kernel_params, Shader, ShaderCode};
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
        /// embed_mtp: the norms' eps, and where the hidden rows start and how far apart.
        eps: f32,
        hid_off: u32,
        hid_stride: u32,
    }
}

const EMBED: Shader<Params> = Shader::new(
    "embed",
    concat!(
        include_str!("../../shaders/weights.wgsl"),
        include_str!("../../shaders/reduce.wgsl"),
        include_str!("../../shaders/cpu.wgsl"),
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
    gather(rec, "embed", table, (ids, ids_off, n), out, None);
}

/// The norms of the MTP layer's input ([`embed_mtp`]): enorm's and hnorm's weights, their
/// eps, and the hidden rows hnorm takes.
pub struct MtpNorms<'a> {
    pub enorm: &'a wgpu::Buffer,
    pub hnorm: &'a wgpu::Buffer,
    pub eps: f32,
    pub hidden: View<'a>,
}

/// The MTP layer's input rows `[enorm(table[ids[ids_off + t]]) ; hnorm(hidden[t])]` into
/// `out` (row t: columns `0 .. 2 dim`), for `t < n`: [`embed`] and two RMSNorms in one
/// dispatch per table chunk. Ids ≥ vocab give zeros in the first half.
pub fn embed_mtp(
    rec: &mut Recorder,
    table: &GpuWeight,
    (ids, ids_off, n): (&wgpu::Buffer, u32, u32),
    norms: &MtpNorms,
    out: View,
) {
    gather(rec, "embed_mtp", table, (ids, ids_off, n), out, Some(norms));
}

/// [`embed`] or [`embed_mtp`] (`entry`, with `norms`).
fn gather(
    rec: &mut Recorder,
    entry: &'static str,
    table: &GpuWeight,
    (ids, ids_off, n): (&wgpu::Buffer, u32, u32),
    out: View,
    norms: Option<&MtpNorms>,
) {
    debug_assert!(
        ids != out.buf,
        "embed: ids and out must be different buffers"
    );
    if n == 0 || table.cols == 0 {
        return;
    }
    let gpu = rec.gpu();
    // CPU adapters: embed_mtp_cpu, one invocation per row, CPU_WG rows a workgroup.
    let cpu = norms.is_some() && super::cpu_kernels(gpu);
    let entry = if cpu { "embed_mtp_cpu" } else { entry };
    let pipe = gpu.pipeline_n(&EMBED, entry, &["W_DTYPE"], &[table.format.code()]);
    let grid = gpu.grid(if cpu { n.div_ceil(super::CPU_WG) } else { n });
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
            eps: norms.map_or(0.0, |m| m.eps),
            hid_off: norms.map_or(0, |m| m.hidden.offset),
            hid_stride: norms.map_or(0, |m| m.hidden.stride),
        };
        match norms {
            None => rec.dispatch(&pipe, &p, &[&c.buf, ids, out.buf], grid),
            Some(m) => {
                let b = [&c.buf, ids, out.buf, m.enorm, m.hidden.buf, m.hnorm];
                rec.dispatch(&pipe, &p, &b, grid)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testutil::{assert_close, gpu, rms_norm_ref, Rng};
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
        let what = format!("vocab={vocab} dim={dim} n={n} {dtype:?} chunk={chunk:?}");
        assert_close(&got, &want, 0.0, 0.0, &format!("embed {what}"));

        // The MTP layer's input: the same rows normalized beside normalized hidden rows
        // (odd offsets and strides; rows of an all-zero out-of-vocabulary embedding).
        let (h_off, h_stride) = (5usize, dim + 7);
        let hidden = rng.vec(h_off + n * h_stride, 3.0);
        let (ew, hw) = (rng.vec(dim, 1.0), rng.vec(dim, 1.0));
        let eps = 1e-5;
        let (c_off, c_stride) = (3usize, 2 * dim + 5);
        let clen = c_off + n * c_stride + 2;
        let cb = g.buffer_from(&vec![SENTINEL; clen], "cat").unwrap();
        let (hb, eb, hnb) = (
            g.buffer_from(&hidden, "hidden").unwrap(),
            g.buffer_from(&ew, "enorm").unwrap(),
            g.buffer_from(&hw, "hnorm").unwrap(),
        );
        let norms = MtpNorms {
            enorm: &eb,
            hnorm: &hnb,
            eps,
            hidden: View::new(&hb, h_off as u32, h_stride as u32),
        };
        let mut rec = g.recorder();
        let cat = View::new(&cb, c_off as u32, c_stride as u32);
        embed_mtp(&mut rec, &wgt, (&ib, ids_off as u32, n as u32), &norms, cat);
        rec.finish().unwrap();
        let got = g.read_f32(&cb, 0, clen).unwrap();
        let mut want = vec![SENTINEL; clen];
        for t in 0..n {
            let row = &mut want[c_off + t * c_stride..][..2 * dim];
            let e = &want_rows(&tr, &ids, ids_off, vocab, dim)[t];
            row[..dim].copy_from_slice(&rms_norm_ref(e, &ew, eps));
            let h = &hidden[h_off + t * h_stride..][..dim];
            row[dim..].copy_from_slice(&rms_norm_ref(h, &hw, eps));
        }
        assert_close(&got, &want, 1e-5, 1e-4, &format!("embed_mtp {what}"));
    }

    /// Each row's embedding as the host reads the table (zeros for ids past it).
    fn want_rows(
        table: &[f32],
        ids: &[u32],
        off: usize,
        vocab: usize,
        dim: usize,
    ) -> Vec<Vec<f32>> {
        ids[off..]
            .iter()
            .map(|&id| match (id as usize) < vocab {
                true => table[id as usize * dim..][..dim].to_vec(),
                false => vec![0.0; dim],
            })
            .collect()
    }

    #[test]
    fn embed_all_dtypes() {
        // embed_mtp both ways: the GPUs' kernel (a workgroup a row) and the CPU adapters'
        // (an invocation a row).
        for cpu in [false, true] {
            crate::kernels::with_cpu_kernels(cpu, embed_all_dtypes_on);
        }
    }

    fn embed_all_dtypes_on() {
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
