//! A weight matrix on the GPU, in its stored dtype or quantized format, split into row chunks.

use super::quant::{e4m3_is_nan, QFormat, FP8_BLOCK};
use super::{DType, TensorRef, WFormat};
use crate::error::{Error, Result};
use crate::gpu::{BufferCopy, Gpu, Write};
use std::borrow::Cow;

/// Rows `row0 .. row0 + rows` of a matrix, in one buffer (element 0 = row `row0`, column 0),
/// and for quantized formats their scales (one per row and block, in a buffer of their own).
pub struct WeightChunk {
    pub buf: wgpu::Buffer,
    pub scale: Option<wgpu::Buffer>,
    pub row0: usize,
    pub rows: usize,
}

/// A row-major `[rows, cols]` matrix (HF `Linear` layout: `[out, in]`). Stacked expert
/// matrices are `[n_experts * rows_per_expert, cols]` with chunk boundaries on experts.
/// Each GPU row holds `stride` elements (`cols`, or `cols` padded to the quantization block).
pub struct GpuWeight {
    pub chunks: Vec<WeightChunk>,
    pub format: WFormat,
    pub rows: usize,
    pub cols: usize,
    pub stride: usize,
}

impl GpuWeight {
    /// A `[rows, cols]` matrix of `format` held in `chunks`.
    fn from_chunks(chunks: Vec<WeightChunk>, format: WFormat, rows: usize, cols: usize) -> Self {
        GpuWeight {
            chunks,
            format,
            rows,
            cols,
            stride: format.stride(cols),
        }
    }

    /// GPU bytes of one row with its scales.
    pub fn row_bytes(&self) -> u64 {
        (self.format.row_bytes(self.cols) + self.format.scale_row_bytes(self.cols)) as u64
    }
}

/// Rows to write into a matrix: floating point, or quantized with their scales.
pub enum RowSource<'a> {
    Float(TensorRef<'a>),
    Quant(QuantPart<'a>),
}

impl<'a> RowSource<'a> {
    /// The weight tensor, and its scale tensor where quantized.
    pub fn tensors(&self) -> (&TensorRef<'a>, Option<&TensorRef<'a>>) {
        match self {
            RowSource::Float(t) => (t, None),
            RowSource::Quant(q) => (&q.weight, Some(&q.scale)),
        }
    }
}

/// One quantized tensor and its scale tensor, as stored in the files.
pub struct QuantPart<'a> {
    pub weight: TensorRef<'a>,
    pub scale: TensorRef<'a>,
}

/// Bytes written through `queue.write_buffer` before we submit and wait, so that wgpu's
/// staging memory stays bounded however large the model is (tests/quantize.rs measures the
/// loader's host memory beyond the GPU bytes: ~120 MB with 64 MB here, ~290 MB with 256 MB).
const FLUSH_BYTES: usize = 64 << 20;
const PIECE: usize = 16 << 20;

struct Writer<'g> {
    gpu: &'g Gpu,
    pending: Vec<u8>,
    offset: u64,
    since_flush: usize,
}

impl<'g> Writer<'g> {
    fn new(gpu: &'g Gpu) -> Self {
        Writer {
            gpu,
            pending: Vec::new(),
            offset: 0,
            since_flush: 0,
        }
    }
    fn push(&mut self, buf: &wgpu::Buffer, mut bytes: &[u8]) -> Result<()> {
        while !bytes.is_empty() {
            let take = (PIECE - self.pending.len()).min(bytes.len());
            self.pending.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.pending.len() == PIECE {
                self.write_out(buf)?;
            }
        }
        Ok(())
    }
    fn write_out(&mut self, buf: &wgpu::Buffer) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        self.gpu.write(buf, self.offset, &self.pending);
        self.offset += self.pending.len() as u64;
        self.since_flush += self.pending.len();
        self.pending.clear();
        if self.since_flush >= FLUSH_BYTES {
            self.gpu.submit([]);
            self.gpu.sync()?;
            self.since_flush = 0;
        }
        Ok(())
    }
}

impl GpuWeight {
    /// Rows per chunk for a matrix of `cols` columns: fits one binding, a multiple of
    /// `align_rows` (experts never straddle chunks) and of 2 (16-bit chunks start on a word).
    fn chunk_rows(
        gpu: &Gpu,
        rows: usize,
        cols: usize,
        format: WFormat,
        align_rows: usize,
        label: &str,
    ) -> Result<usize> {
        let row_bytes = format.row_bytes(cols) as u64;
        let fit = (gpu.max_binding() / row_bytes.max(1)) as usize;
        let align = if align_rows.is_multiple_of(2) {
            align_rows
        } else {
            align_rows * 2
        };
        let per = fit / align * align;
        if per == 0 {
            if rows * row_bytes as usize <= gpu.max_binding() as usize {
                return Ok(rows);
            }
            return Err(Error::msg(format!(
                "{label}: a block of {align_rows} rows × {cols} columns does not fit the adapter's storage binding limit of {} bytes",
                gpu.max_binding()
            )));
        }
        Ok(per.min(rows).max(1))
    }

    /// Upload the row-wise concatenation of `parts` (each `[r_i, cols]`, one dtype) as one
    /// matrix. `align_rows` keeps groups of rows (e.g. one expert) inside one chunk.
    pub fn upload(
        gpu: &Gpu,
        parts: &[TensorRef],
        cols: usize,
        align_rows: usize,
        label: &str,
    ) -> Result<GpuWeight> {
        Self::upload_in(gpu, parts, cols, align_rows, label, false)
    }

    /// [`GpuWeight::upload`], into host memory that the kernels read over the bus where
    /// `host` ([`Gpu::host_storage`]).
    pub fn upload_in(
        gpu: &Gpu,
        parts: &[TensorRef],
        cols: usize,
        align_rows: usize,
        label: &str,
        host: bool,
    ) -> Result<GpuWeight> {
        let first = parts
            .first()
            .ok_or_else(|| Error::msg(format!("{label}: no tensors")))?;
        let dtype = first.dtype()?;
        let mut rows = 0;
        for p in parts {
            if p.dtype()? != dtype {
                return Err(Error::msg(format!(
                    "tensor {}: dtype {:?} differs from {:?} of {} (one matrix must have one dtype)",
                    p.name, p.dtype, first.dtype, first.name
                )));
            }
            let n = p.numel();
            if cols == 0 || n % cols != 0 || p.shape.last() != Some(&cols) {
                return Err(Error::msg(format!(
                    "tensor {} in {}: shape {:?}, expected [*, {cols}]",
                    p.name,
                    p.file.display(),
                    p.shape
                )));
            }
            rows += n / cols;
            check_finite(p, dtype)?;
        }
        let sources: Vec<&[u8]> = parts.iter().map(|p| p.bytes).collect();
        let place = (label, host);
        Self::upload_bytes(gpu, &sources, rows, cols, dtype, align_rows, None, place)
    }

    /// Upload raw bytes of `dtype` (the concatenation of `sources` is `[rows, cols]`).
    /// `max_chunk_rows` forces smaller chunks (tests exercise the split path with it).
    /// `(label, host)`: the buffers' label, and whether they are in host memory
    /// ([`Gpu::host_storage`]).
    #[allow(clippy::too_many_arguments)]
    pub fn upload_bytes(
        gpu: &Gpu,
        sources: &[&[u8]],
        rows: usize,
        cols: usize,
        dtype: DType,
        align_rows: usize,
        max_chunk_rows: Option<usize>,
        (label, host): (&str, bool),
    ) -> Result<GpuWeight> {
        let row_bytes = cols * dtype.size();
        let total: usize = sources.iter().map(|s| s.len()).sum();
        if total != rows * row_bytes {
            return Err(Error::msg(format!(
                "{label}: {total} bytes, expected {rows}×{cols} {}",
                dtype.name()
            )));
        }
        let format = WFormat::Float(dtype);
        let mut per = Self::chunk_rows(gpu, rows, cols, format, align_rows.max(1), label)?;
        if let Some(m) = max_chunk_rows {
            per = per.min(m.max(1));
        }
        let mut chunks = Vec::new();
        let mut src_i = 0;
        let mut src_off = 0;
        let mut row0 = 0;
        let mut w = Writer {
            gpu,
            pending: Vec::new(),
            offset: 0,
            since_flush: 0,
        };
        while row0 < rows {
            let n = per.min(rows - row0);
            let buf = match host {
                true => gpu.host_storage((n * row_bytes) as u64, label)?,
                false => gpu.buffer((n * row_bytes) as u64, label)?,
            };
            w.offset = 0;
            let mut need = n * row_bytes;
            while need > 0 {
                let s = sources[src_i];
                let take = (s.len() - src_off).min(need);
                w.push(&buf, &s[src_off..src_off + take])?;
                src_off += take;
                need -= take;
                if src_off == s.len() {
                    src_i += 1;
                    src_off = 0;
                }
            }
            w.write_out(&buf)?;
            chunks.push(WeightChunk {
                buf,
                scale: None,
                row0,
                rows: n,
            });
            row0 += n;
        }
        Ok(Self::from_chunks(chunks, format, rows, cols))
    }

    /// A matrix from host f32 values, stored as `dtype` (tests and synthetic models).
    pub fn from_f32(
        gpu: &Gpu,
        data: &[f32],
        rows: usize,
        cols: usize,
        dtype: DType,
        max_chunk_rows: Option<usize>,
        label: &str,
    ) -> Result<GpuWeight> {
        let bytes = dtype.from_f32(data);
        let label = (label, false);
        Self::upload_bytes(gpu, &[&bytes], rows, cols, dtype, 1, max_chunk_rows, label)
    }

    /// Upload the row-wise concatenation of quantized `parts` (each `[r_i, cols]` logically,
    /// one format) as one matrix: rows are padded to the block, scales expanded to one per
    /// (row, block). FP8 bytes that are NaN are refused here, naming the tensor and row.
    pub fn upload_quant(
        gpu: &Gpu,
        parts: &[QuantPart],
        fmt: QFormat,
        cols: usize,
        align_rows: usize,
        max_chunk_rows: Option<usize>,
        label: &str,
    ) -> Result<GpuWeight> {
        let mut srcs = Vec::with_capacity(parts.len());
        for p in parts {
            srcs.push(QuantSource::check(p, fmt, cols, true)?);
        }
        Self::upload_quant_sources(gpu, &srcs, fmt, cols, align_rows, max_chunk_rows, label)
    }

    /// A quantized matrix from host f32 values (tests): q8/q4 quantized as `sparsa quantize`
    /// does, FP8 as the official releases do.
    pub fn quantize_f32(
        gpu: &Gpu,
        data: &[f32],
        rows: usize,
        cols: usize,
        fmt: QFormat,
        max_chunk_rows: Option<usize>,
        label: &str,
    ) -> Result<GpuWeight> {
        let (w, s) = match fmt {
            QFormat::Fp8 => super::quant::quantize_fp8(data, rows, cols),
            _ => super::quant::quantize_rows(fmt, data, cols),
        };
        Self::upload_quant_raw(gpu, &w, &s, rows, cols, fmt, max_chunk_rows, label)
    }

    /// A quantized matrix from its file-layout bytes (weights, scales) — tests.
    #[allow(clippy::too_many_arguments)]
    pub fn upload_quant_raw(
        gpu: &Gpu,
        w: &[u8],
        s: &[u8],
        rows: usize,
        cols: usize,
        fmt: QFormat,
        max_chunk_rows: Option<usize>,
        label: &str,
    ) -> Result<GpuWeight> {
        let src = QuantSource {
            name: label.to_string(),
            w,
            s,
            rows,
        };
        Self::upload_quant_sources(gpu, &[src], fmt, cols, 1, max_chunk_rows, label)
    }

    fn upload_quant_sources(
        gpu: &Gpu,
        srcs: &[QuantSource],
        fmt: QFormat,
        cols: usize,
        align_rows: usize,
        max_chunk_rows: Option<usize>,
        label: &str,
    ) -> Result<GpuWeight> {
        let format = WFormat::Quant(fmt);
        let rows: usize = srcs.iter().map(|s| s.rows).sum();
        let frb = fmt.file_row_bytes(cols);
        let grb = format.row_bytes(cols);
        let srb = format.scale_row_bytes(cols);
        let mut per = Self::chunk_rows(gpu, rows, cols, format, align_rows.max(1), label)?;
        if let Some(m) = max_chunk_rows {
            per = per.min(m.max(1));
        }
        if fmt == QFormat::Fp8 {
            for src in srcs {
                src.check_fp8(frb)?;
            }
        }
        let pad = vec![0u8; grb - frb];
        let mut ww = Writer::new(gpu);
        let mut sw = Writer::new(gpu);
        let mut chunks = Vec::new();
        let (mut part, mut r) = (0usize, 0usize);
        let mut row0 = 0;
        while row0 < rows {
            let n = per.min(rows - row0);
            let buf = gpu.buffer((n * grb) as u64, label)?;
            let sbytes = (n * srb).div_ceil(4) * 4;
            let sbuf = gpu.buffer(sbytes as u64, label)?;
            ww.offset = 0;
            sw.offset = 0;
            for _ in 0..n {
                while r == srcs[part].rows {
                    part += 1;
                    r = 0;
                }
                let src = &srcs[part];
                ww.push(&buf, &src.w[r * frb..(r + 1) * frb])?;
                ww.push(&buf, &pad)?;
                sw.push(&sbuf, src.scales_of_row(r, fmt, srb))?;
                r += 1;
            }
            sw.push(&sbuf, &[0u8; 3][..sbytes - n * srb])?;
            ww.write_out(&buf)?;
            sw.write_out(&sbuf)?;
            chunks.push(WeightChunk {
                buf,
                scale: Some(sbuf),
                row0,
                rows: n,
            });
            row0 += n;
        }
        Ok(Self::from_chunks(chunks, format, rows, cols))
    }

    /// An uninitialized `[rows, cols]` matrix of `format` (rows that
    /// [`GpuWeight::write_rows`] fills later: the routed-expert slots), chunked like an
    /// uploaded one with groups of `align_rows` rows never split.
    pub fn empty(
        gpu: &Gpu,
        rows: usize,
        cols: usize,
        format: WFormat,
        align_rows: usize,
        label: &str,
    ) -> Result<GpuWeight> {
        Self::empty_in(gpu, rows, cols, format, align_rows, label, false)
    }

    /// [`GpuWeight::empty`], in host memory ([`Gpu::host_buffer`]) where `host`: the
    /// expert cache's host copy, which the GPU copies slots from.
    #[allow(clippy::too_many_arguments)]
    pub fn empty_in(
        gpu: &Gpu,
        rows: usize,
        cols: usize,
        format: WFormat,
        align_rows: usize,
        label: &str,
        host: bool,
    ) -> Result<GpuWeight> {
        let per = Self::chunk_rows(gpu, rows, cols, format, align_rows.max(1), label)?;
        let (grb, srb) = (format.row_bytes(cols), format.scale_row_bytes(cols));
        let make = |bytes: usize| match host {
            true => gpu.host_buffer(bytes as u64, label),
            false => gpu.buffer(bytes as u64, label),
        };
        let mut chunks = Vec::new();
        let mut row0 = 0;
        while row0 < rows {
            let n = per.min(rows - row0);
            let buf = make(n * grb)?;
            let scale = match format {
                WFormat::Quant(_) => Some(make((n * srb).div_ceil(4) * 4)?),
                WFormat::Float(_) => None,
            };
            chunks.push(WeightChunk {
                buf,
                scale,
                row0,
                rows: n,
            });
            row0 += n;
        }
        Ok(Self::from_chunks(chunks, format, rows, cols))
    }

    /// The writes that overwrite rows `row0 ..` with `parts` (consecutive, one chunk, this
    /// matrix's format), added to `out` for [`Gpu::write_batch`]: the files' bytes as they
    /// are where the GPU layout is the file layout, else rows padded / scales expanded on the
    /// host. `check` scans the values as the loader does (finite floats, no FP8 NaN bytes).
    /// Returns the bytes written.
    pub fn write_rows<'a>(
        &self,
        out: &mut Vec<Write<'a>>,
        row0: usize,
        parts: &[RowSource<'a>],
        check: bool,
    ) -> Result<u64> {
        let mut put = |buf: &wgpu::Buffer, off: usize, bytes: Cow<'a, [u8]>| {
            out.push(Write {
                buf: buf.clone(),
                offset: off as u64,
                bytes,
            })
        };
        let cols = self.cols;
        let mut r = row0;
        let mut written = 0u64;
        for part in parts {
            let c = self
                .chunks
                .iter()
                .find(|c| r >= c.row0 && r < c.row0 + c.rows)
                .ok_or_else(|| Error::msg(format!("row {r} is outside the matrix")))?;
            let local = r - c.row0;
            let fits = |n: usize| -> Result<()> {
                if local + n > c.rows {
                    return Err(Error::msg(format!(
                        "rows {r}..{} straddle a chunk boundary",
                        r + n
                    )));
                }
                Ok(())
            };
            let aligned = |what: &str, off: usize, len: usize| -> Result<()> {
                if !off.is_multiple_of(4) || !len.is_multiple_of(4) {
                    return Err(Error::msg(format!(
                        "{what}: rows of {cols} columns do not start on 4-byte boundaries in {} (expert offloading needs them to)",
                        self.format.name()
                    )));
                }
                Ok(())
            };
            let rows = match (part, self.format) {
                (RowSource::Float(t), WFormat::Float(d)) => {
                    if t.dtype()? != d || t.numel() % cols.max(1) != 0 {
                        return Err(Error::msg(format!(
                            "tensor {}: {:?} {:?}, expected rows of {cols} {}",
                            t.name,
                            t.dtype,
                            t.shape,
                            d.name()
                        )));
                    }
                    if check {
                        check_finite(t, d)?;
                    }
                    let rb = cols * d.size();
                    fits(t.numel() / cols.max(1))?;
                    aligned(&t.name, local * rb, t.bytes.len())?;
                    put(&c.buf, local * rb, Cow::Borrowed(t.bytes));
                    written += t.bytes.len() as u64;
                    t.numel() / cols.max(1)
                }
                (RowSource::Quant(q), WFormat::Quant(fmt)) => {
                    let src = QuantSource::check(q, fmt, cols, check)?;
                    let frb = fmt.file_row_bytes(cols);
                    let grb = self.format.row_bytes(cols);
                    let srb = self.format.scale_row_bytes(cols);
                    let n = src.rows;
                    if check && fmt == QFormat::Fp8 {
                        src.check_fp8(frb)?;
                    }
                    fits(n)?;
                    aligned(&src.name, local * grb, n * grb)?;
                    if frb == grb {
                        put(&c.buf, local * grb, Cow::Borrowed(src.w));
                    } else {
                        let mut rows = vec![0u8; n * grb];
                        for (d, s) in rows.chunks_mut(grb).zip(src.w.chunks(frb)) {
                            d[..frb].copy_from_slice(s);
                        }
                        put(&c.buf, local * grb, Cow::Owned(rows));
                    }
                    let sbuf = c.scale.as_ref().ok_or_else(|| {
                        Error::msg(format!("{}: quantized rows without scales", src.name))
                    })?;
                    aligned(&src.name, local * srb, n * srb)?;
                    if fmt == QFormat::Fp8 {
                        let sc = (0..n).flat_map(|i| src.scales_of_row(i, fmt, srb));
                        put(sbuf, local * srb, Cow::Owned(sc.copied().collect()));
                    } else {
                        put(sbuf, local * srb, Cow::Borrowed(&src.s[..n * srb]));
                    }
                    written += (n * (grb + srb)) as u64;
                    n
                }
                _ => {
                    return Err(Error::msg(format!(
                        "rows for a {} matrix stored in another format",
                        self.format.name()
                    )))
                }
            };
            r += rows;
        }
        Ok(written)
    }

    /// The copies that put rows `from .. from + n` of `self` into rows `to .. to + n` of
    /// `dst` (same format and columns; neither range straddles a chunk): the weights' and
    /// the scales'. None where a range is not 4-byte aligned (copies need it) or out of place.
    pub fn copy_rows(
        &self,
        from: usize,
        dst: &GpuWeight,
        to: usize,
        n: usize,
    ) -> Option<Vec<BufferCopy>> {
        if self.format != dst.format || self.cols != dst.cols {
            return None;
        }
        // The chunk holding rows r .. r + n, and r's row in it.
        fn find(w: &GpuWeight, r: usize, n: usize) -> Option<(&WeightChunk, usize)> {
            w.chunks
                .iter()
                .find(|c| r >= c.row0 && r + n <= c.row0 + c.rows)
                .map(|c| (c, r - c.row0))
        }
        let ((sc, sl), (dc, dl)) = (find(self, from, n)?, find(dst, to, n)?);
        let (grb, srb) = (
            self.format.row_bytes(self.cols),
            self.format.scale_row_bytes(self.cols),
        );
        let mut out = vec![(&sc.buf, sl * grb, &dc.buf, dl * grb, n * grb)];
        if let (Some(ss), Some(ds)) = (&sc.scale, &dc.scale) {
            out.push((ss, sl * srb, ds, dl * srb, n * srb));
        }
        let aligned = |v: usize| v.is_multiple_of(4);
        out.iter()
            .all(|&(_, a, _, b, len)| aligned(a) && aligned(b) && aligned(len))
            .then(|| {
                out.into_iter()
                    .map(|(src, a, dst, b, len)| BufferCopy {
                        src: src.clone(),
                        src_off: a as u64,
                        dst: dst.clone(),
                        dst_off: b as u64,
                        size: len as u64,
                    })
                    .collect()
            })
    }

    /// Bytes on the GPU (weights and scales).
    pub fn bytes(&self) -> u64 {
        (self.rows * (self.format.row_bytes(self.cols) + self.format.scale_row_bytes(self.cols)))
            as u64
    }
}

/// A checked quantized part: its bytes in file layout.
struct QuantSource<'a> {
    name: String,
    w: &'a [u8],
    s: &'a [u8],
    rows: usize,
}

/// NaN or ±inf in a weight would turn every output it touches into garbage, so the bytes
/// are checked on their way to the GPU (a few GB/s; see docs/ROBUSTNESS.md).
fn check_finite(t: &TensorRef, dtype: DType) -> Result<()> {
    if let Some(i) = dtype.first_non_finite(t.bytes) {
        let s = dtype.size();
        return Err(Error::msg(format!(
            "tensor {} in {}: element {i} is {} (weights must be finite)",
            t.name,
            t.file.display(),
            dtype.to_f32(&t.bytes[i * s..(i + 1) * s])[0]
        )));
    }
    Ok(())
}

impl<'a> QuantSource<'a> {
    /// Refuses FP8 weights holding an e4m3 NaN byte, naming the row (`frb` bytes a row).
    fn check_fp8(&self, frb: usize) -> Result<()> {
        match self.w.iter().position(|&b| e4m3_is_nan(b)) {
            Some(i) => Err(Error::msg(format!(
                "tensor {}: row {} holds an e4m3 NaN byte (0x7F or 0xFF); FP8 weights must be finite",
                self.name,
                i / frb.max(1)
            ))),
            None => Ok(()),
        }
    }

    /// The scales of row `r` (`srb` bytes): q8 / q4 rows have their own, FP8 rows share a
    /// row of 128×128 block scales.
    fn scales_of_row(&self, r: usize, fmt: QFormat, srb: usize) -> &'a [u8] {
        let si = if fmt == QFormat::Fp8 {
            r / FP8_BLOCK
        } else {
            r
        };
        &self.s[si * srb..(si + 1) * srb]
    }

    /// `p` checked by [`super::quant::check_pair`] (the scales' values only when `scan`).
    fn check(p: &QuantPart<'a>, fmt: QFormat, cols: usize, scan: bool) -> Result<QuantSource<'a>> {
        let (w, s) = (&p.weight, &p.scale);
        let rows = super::quant::check_pair(w, s, fmt, cols, scan)?;
        Ok(QuantSource {
            name: w.name.clone(),
            w: w.bytes,
            s: s.bytes,
            rows,
        })
    }
}
