//! Host→GPU upload paths compared on this adapter (expert offloading's staging): 256 MiB in
//! 16 MiB pieces from a pre-faulted host buffer, each path timed to the GPU's completion.
//!
//! `cargo run --release --example h2d`

use sparsa::gpu::Gpu;
use std::time::Instant;

fn par_copy(dst: &mut [u8], src: &[u8], threads: usize) {
    let per = src.len().div_ceil(threads);
    std::thread::scope(|s| {
        for (d, x) in dst.chunks_mut(per).zip(src.chunks(per)) {
            s.spawn(move || d.copy_from_slice(x));
        }
    });
}

fn main() -> sparsa::Result<()> {
    let gpu = Gpu::new(None)?;
    println!("{}", gpu.adapter.line());
    let piece = 16usize << 20;
    let total = (gpu.max_binding() as usize).min(256 << 20) / piece * piece;
    let host: Vec<u8> = (0..piece).map(|i| (i * 31 % 251) as u8).collect();
    let dst = gpu.buffer(total as u64, "dst")?;
    let mappable = gpu
        .device
        .features()
        .contains(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS);
    let time = |name: &str, f: &mut dyn FnMut() -> sparsa::Result<()>| -> sparsa::Result<()> {
        let mut best = f64::MAX;
        for run in 0..4 {
            gpu.sync()?;
            let t = Instant::now();
            f()?;
            gpu.sync()?;
            if run > 0 {
                best = best.min(t.elapsed().as_secs_f64());
            }
        }
        println!("{name:<58} {:6.1} GB/s", total as f64 / best / 1e9);
        Ok(())
    };
    println!(
        "{:<58} {:6.1} GB/s",
        "write_batch (write_buffer_with, up to 16 threads)",
        sparsa::bench::h2d_bandwidth(&gpu)? / 1e9
    );
    // From a memory-mapped file (pass its path; page-cache warm): first touch vs second.
    if let Some(path) = std::env::args().nth(1) {
        let f = std::fs::File::open(&path).expect("file");
        // SAFETY: a read-only map of a file nobody writes during the run.
        let map = unsafe { memmap2::Mmap::map(&f) }.expect("mmap");
        let _ = std::fs::read(&path); // into the page cache
                                      // `src` in writes of `size` bytes, timed to the GPU's completion.
        let timed = |src: &[u8], size: usize, what: &str| -> sparsa::Result<()> {
            let t = Instant::now();
            let writes: Vec<sparsa::gpu::Write> = src
                .chunks(size)
                .enumerate()
                .map(|(i, c)| sparsa::gpu::Write {
                    buf: dst.clone(),
                    offset: (i * size) as u64,
                    bytes: std::borrow::Cow::Borrowed(c),
                })
                .collect();
            gpu.write_batch(&writes);
            gpu.submit([]);
            gpu.sync()?;
            let rate = src.len() as f64 / t.elapsed().as_secs_f64() / 1e9;
            println!("write_batch from an mmap, {what:<32} {rate:6.1} GB/s");
            Ok(())
        };
        let first = &map[..total.min(map.len()) / piece * piece];
        timed(first, piece, "first touch")?;
        timed(first, piece, "second touch")?;
        // Writes of 6 MiB (one expert tensor) instead of 16 MiB pieces.
        let small = 6usize << 20;
        let rest = &map[total.min(map.len())..];
        timed(
            &rest[..total.min(rest.len()) / small * small],
            small,
            "first touch, 6 MiB writes",
        )?;
    }
    for (label, usage, ok) in [
        (
            "fresh MAP_WRITE|COPY_SRC at creation + copy",
            wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
            true,
        ),
        (
            "fresh MAP_READ|COPY_SRC at creation + copy (host memory)",
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_SRC,
            mappable,
        ),
        (
            "fresh COPY_SRC at creation + copy",
            wgpu::BufferUsages::COPY_SRC,
            true,
        ),
    ] {
        if !ok {
            println!("{label:<58} (needs MAPPABLE_PRIMARY_BUFFERS)");
            continue;
        }
        for threads in [1, 4, 8] {
            let mut fill = 0.0;
            time(&format!("{label}, {threads} thr"), &mut || {
                let mut rec = gpu.recorder();
                let t = Instant::now();
                for off in (0..total).step_by(piece) {
                    let b = gpu.create_buffer(&wgpu::BufferDescriptor {
                        label: Some("staging"),
                        size: piece as u64,
                        usage,
                        mapped_at_creation: true,
                    });
                    {
                        let mut v = b.slice(..).get_mapped_range_mut().expect("mapped");
                        let mut w = v.slice(..);
                        let p = w.as_raw_element_ptr().as_ptr();
                        // SAFETY: the mapping is `piece` bytes, written only here.
                        let d = unsafe { std::slice::from_raw_parts_mut(p, piece) };
                        par_copy(d, &host, threads);
                    }
                    b.unmap();
                    rec.copy(&b, 0, &dst, off as u64, piece as u64);
                }
                fill = t.elapsed().as_secs_f64();
                rec.finish()
            })?;
            println!(
                "    (host fill of the last run {:.1} GB/s)",
                total as f64 / fill / 1e9
            );
        }
    }
    Ok(())
}
