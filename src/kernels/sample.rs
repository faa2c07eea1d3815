//! Token selection on the GPU (`shaders/sample.wgsl`): the greedy argmax of a logits row,
//! written where the next decode step's embedding reads its token, so greedy decoding needs
//! no logits readback and the host can queue step `n + 1` before step `n`'s token is known.
use super::{Recorder, View};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    x_off: u32,
    n: u32,
    parts: u32,
    per_part: u32,
    out_off: u32,
    _pad: [u32; 3],
}

/// Largest number of workgroups of the first pass.
pub const MAX_PARTS: u32 = 256;
/// Elements per first-pass workgroup when the row is long enough (8 per invocation).
const PER_PART: u32 = 2048;

/// u32 words of the scratch [`argmax`] needs (a (key, index) pair per first-pass workgroup).
pub const PART_WORDS: u64 = 2 * MAX_PARTS as u64;

/// `out[out_off] = argmax(x[0..n])` of the row starting at `x`: the lowest index among equal
/// maxima, NaN skipped (0 when all are NaN), as [`crate::generate::argmax`]. `part` holds at
/// least [`PART_WORDS`] u32s; `out` is a u32 buffer (e.g. the token ids a chunk embeds).
pub fn argmax(
    rec: &mut Recorder,
    x: View,
    n: u32,
    part: &wgpu::Buffer,
    out: &wgpu::Buffer,
    out_off: u32,
) {
    assert!(n > 0, "argmax of an empty row");
    let per_part = PER_PART.max(n.div_ceil(MAX_PARTS)).next_multiple_of(256);
    let parts = n.div_ceil(per_part);
    let p = Params {
        x_off: x.offset,
        n,
        parts,
        per_part,
        out_off,
        _pad: [0; 3],
    };
    let gpu = rec.gpu();
    let pipe = |e| gpu.pipeline("sample", super::src::SAMPLE, e, &[]);
    rec.cost(4 * n as u64, 0, "");
    rec.dispatch(&pipe("argmax_part"), &p, &[part, x.buf], [parts, 1, 1]);
    rec.dispatch(&pipe("argmax_final"), &p, &[part, out], [1, 1, 1]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::argmax as host_argmax;
    use crate::kernels::testutil::{gpu, Rng};

    fn check(x: &[f32], x_off: usize, what: &str) {
        let g = gpu();
        let mut buf = vec![7.0f32; x_off];
        buf.extend_from_slice(x);
        buf.extend_from_slice(&[1e30, f32::INFINITY]);
        let xb = g.buffer_from(&buf, "x").unwrap();
        let part = g.buffer(4 * PART_WORDS, "part").unwrap();
        let out = g.buffer_from(&[11u32, 22, 33], "out").unwrap();
        let mut rec = g.recorder();
        argmax(
            &mut rec,
            View::new(&xb, x_off as u32, 0),
            x.len() as u32,
            &part,
            &out,
            1,
        );
        rec.finish().unwrap();
        let got = g.read_u32(&out, 0, 3).unwrap();
        assert_eq!(
            got,
            vec![11, host_argmax(x), 33],
            "{what} (n = {})",
            x.len()
        );
    }

    #[test]
    fn argmax_matches_the_host_rule() {
        let mut rng = Rng::new(5);
        for (i, &n) in [1usize, 7, 255, 256, 2049, 4097, 70_001, 154_880, 600_000]
            .iter()
            .enumerate()
        {
            let mut x = rng.vec(n, 10.0);
            check(&x, i * 3, "random");
            // The maximum repeated further on: the first one wins.
            let at = rng.below(n as u64) as usize;
            x[at] = 20.0;
            let again = (at + 1 + rng.below(n as u64) as usize) % n;
            x[again] = 20.0;
            check(&x, i, "tied maxima");
            // NaN everywhere but a few, and -inf.
            let mut y = vec![f32::NAN; n];
            y[n - 1] = f32::NEG_INFINITY;
            y[n / 2] = -3.0;
            check(&y, 0, "NaN skipped");
            check(&vec![f32::NAN; n], 2, "all NaN");
            check(&vec![f32::NEG_INFINITY; n], 1, "all -inf");
            let mut z = vec![-0.0f32; n];
            z[n - 1] = 0.0;
            check(&z, 0, "-0 equals +0");
        }
    }
}
