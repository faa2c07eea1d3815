//! A weight matrix on the GPU, in its stored dtype, split into row chunks.

use super::{DType, TensorRef};
use crate::error::{Error, Result};
use crate::gpu::Gpu;

/// Rows `row0 .. row0 + rows` of a matrix, in one buffer (element 0 = row `row0`, column 0).
pub struct WeightChunk {
    pub buf: wgpu::Buffer,
    pub row0: usize,
    pub rows: usize,
}

/// A row-major `[rows, cols]` matrix (HF `Linear` layout: `[out, in]`). Stacked expert
/// matrices are `[n_experts * rows_per_expert, cols]` with chunk boundaries on experts.
pub struct GpuWeight {
    pub chunks: Vec<WeightChunk>,
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
}

/// Bytes written through `queue.write_buffer` before we submit and wait, so that wgpu's
/// staging memory stays bounded however large the model is.
const FLUSH_BYTES: usize = 256 << 20;
const PIECE: usize = 16 << 20;

struct Writer<'g> {
    gpu: &'g Gpu,
    pending: Vec<u8>,
    offset: u64,
    since_flush: usize,
}

impl<'g> Writer<'g> {
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
            self.gpu.queue.submit([]);
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
        dtype: DType,
        align_rows: usize,
        label: &str,
    ) -> Result<usize> {
        let row_bytes = (cols * dtype.size()) as u64;
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
        }
        let sources: Vec<&[u8]> = parts.iter().map(|p| p.bytes).collect();
        Self::upload_bytes(gpu, &sources, rows, cols, dtype, align_rows, None, label)
    }

    /// Upload raw bytes of `dtype` (the concatenation of `sources` is `[rows, cols]`).
    /// `max_chunk_rows` forces smaller chunks (tests exercise the split path with it).
    #[allow(clippy::too_many_arguments)]
    pub fn upload_bytes(
        gpu: &Gpu,
        sources: &[&[u8]],
        rows: usize,
        cols: usize,
        dtype: DType,
        align_rows: usize,
        max_chunk_rows: Option<usize>,
        label: &str,
    ) -> Result<GpuWeight> {
        let row_bytes = cols * dtype.size();
        let total: usize = sources.iter().map(|s| s.len()).sum();
        if total != rows * row_bytes {
            return Err(Error::msg(format!(
                "{label}: {total} bytes, expected {rows}×{cols} {}",
                dtype.name()
            )));
        }
        let mut per = Self::chunk_rows(gpu, rows, cols, dtype, align_rows.max(1), label)?;
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
            let buf = gpu.buffer((n * row_bytes) as u64, label)?;
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
            chunks.push(WeightChunk { buf, row0, rows: n });
            row0 += n;
        }
        Ok(GpuWeight {
            chunks,
            dtype,
            rows,
            cols,
        })
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
        Self::upload_bytes(gpu, &[&bytes], rows, cols, dtype, 1, max_chunk_rows, label)
    }

    pub fn bytes(&self) -> u64 {
        (self.rows * self.cols * self.dtype.size()) as u64
    }
}
