//! One layer's mixture of experts: `h += Σ_k w_k · expert_k(x) + shared(x)`.
//!
//! The router scores the experts of each row and picks k of them on the GPU (sigmoid
//! scores plus the correction bias, router groups where the config has them). The routed
//! experts then run as two expert matmuls around a SwiGLU, reading each row's expert ids
//! from the router's output. The shared expert runs with them as one more routed expert
//! (expert E, weight 1, appended by the router) where the experts are resident, else as a
//! dense SwiGLU; `moe_combine` adds the weighted expert outputs to `h`.
//!
//! Where the layer's experts do not all fit the GPU (`--gpu-memory`), the host must know
//! which experts the router picked before it can upload them: [`Session::stream_experts`]
//! submits the work recorded so far, waits for the routing, uploads the missing experts into
//! the layer's slots and runs the same expert matmuls on a slot table instead of the ids
//! (see [`crate::experts`]).

use super::load::Moe;
use super::session::Session;
use crate::error::Result;
#[cfg(not(target_arch = "wasm32"))]
use crate::experts::CpuPart;
use crate::experts::{ExpertSource, Offload};
#[cfg(not(target_arch = "wasm32"))]
use crate::gpu::BufferCopy;
use crate::gpu::Recorder;
use crate::kernels::matmul::{Routed, XQuant};
use crate::kernels::{elementwise, matmul, router, View};

impl Session {
    /// `h += Σ_k w_k · expert_k(x) + shared(x)` for MoE layer `i` (`x` already normalized).
    /// `xq`: x quantized for the expert GEMVs, where it was (decode).
    pub(super) fn moe(
        &self,
        rec: &mut Recorder,
        i: usize,
        m: &Moe,
        t: u32,
        xq: Option<&XQuant>,
    ) -> Result<()> {
        let cfg = &self.model.config;
        let s = &self.s;
        let hd = cfg.hidden_size as u32;
        let k = m.pairs(cfg.num_experts_per_tok) as u32;
        let e = cfg.n_routed_experts as u32;
        // The shared expert, where it runs as routed expert E, follows each row's picks.
        let shared = m.shared_routed.then_some(e);
        self.route(rec, m, t, &s.router_idx, &s.router_weights, shared);
        let shared_done = match (&m.source, &self.model.offload) {
            (Some(src), Some(off)) => self.stream_experts(rec, off, i, src, m, t, xq)?,
            _ => {
                self.experts(rec, m, &s.router_idx, e + m.shared_routed as u32, t, xq);
                false
            }
        };
        if let (Some(sh), false) = (&m.shared, shared_done) {
            self.swiglu(rec, sh, t, xq);
        }
        let out = View::rows(&s.moe_out, hd);
        let h = View::rows(&s.h, hd);
        elementwise::moe_combine(rec, out, &s.router_weights, k, h, t, hd);
        Ok(())
    }

    /// The router of `m` on `x`: each row's k experts into `idx` and their weights into
    /// `weights` (then expert `extra` with weight 1, where given).
    fn route(
        &self,
        rec: &mut Recorder,
        m: &Moe,
        t: u32,
        idx: &wgpu::Buffer,
        weights: &wgpu::Buffer,
        extra: Option<u32>,
    ) {
        let s = &self.s;
        let r = &self.dims.routing;
        let hd = self.model.config.hidden_size as u32;
        let x = View::rows(&s.x, hd);
        // A decode row, or the few rows of a verification or a small batch: the router's
        // GEMV and the routing in one dispatch where it applies (`SPARSA_ROUTER_FUSED=0`:
        // two, a measurement aid). Not on CPU adapters: there its workgroup per expert and
        // last-workgroup hand-off cost more than the two dispatches (built-in model on
        // lavapipe: 2.07 ms a step against 0.77 + ~0.5; BENCHMARKS.md, "lavapipe: kernels
        // for CPU adapters").
        if crate::knobs::knob_on!("SPARSA_ROUTER_FUSED")
            && !crate::kernels::cpu_kernels(rec.gpu())
            && router::route_gemv(
                rec,
                x,
                t,
                &m.router,
                &m.bias,
                r,
                (idx, weights),
                extra,
                &s.router_tally,
            )
        {
            return;
        }
        let logits = View::rows(&s.router_logits, r.n_experts);
        matmul::matmul(rec, x, &m.router, logits, t);
        router::route(rec, logits, &m.bias, t, r, (idx, weights), extra);
    }

    /// The routed experts named by `idx` (expert ids, or slots of the expert cache; `n` of
    /// them in `m`'s matrices) on `x`, each routed pair's output into `s.moe_out` (the
    /// shared expert's too, where it runs as a routed one).
    fn experts(
        &self,
        rec: &mut Recorder,
        m: &Moe,
        idx: &wgpu::Buffer,
        n: u32,
        t: u32,
        xq: Option<&XQuant>,
    ) {
        let cfg = &self.model.config;
        let s = &self.s;
        let hd = cfg.hidden_size as u32;
        let k = m.pairs(cfg.num_experts_per_tok) as u32;
        let mi = cfg.moe_intermediate_size as u32;
        let x = View::rows(&s.x, hd);
        let gu = View::rows(&s.moe_gate_up, 2 * mi);
        let act = View::rows(&s.moe_act, mi);
        let out = View::rows(&s.moe_out, hd);
        let routed = Routed {
            ids: idx,
            n_experts: n,
            topk: k,
        };
        match xq {
            Some(q) => matmul::matmul_experts_xq(rec, q, x, false, &m.gate_up, &routed, gu, t),
            None => matmul::matmul_experts(rec, x, false, &m.gate_up, &routed, gu, t),
        }
        match self.swiglu_for(rec, gu, act, t, k, mi, &m.down, &s.xq_act) {
            Some(q) => matmul::matmul_experts_xq(rec, &q, act, true, &m.down, &routed, out, t),
            None => matmul::matmul_experts(rec, act, true, &m.down, &routed, out, t),
        }
    }

    /// Layer `i`'s routed experts from the expert cache: submit, wait for the router's
    /// choices, upload what is missing into the layer's slots and run the experts over the
    /// slot table, in as many rounds as the cache needs (see [`crate::experts`]). A chunk of
    /// few rows under `--cpu-experts` runs its misses on the CPU instead, while the GPU runs
    /// the resident ones and the shared expert (returns whether the shared expert was
    /// recorded here). With `--expert-prefetch` at decode, the next layer's router also runs
    /// on this layer's input, and the experts it predicts are uploaded while the GPU works on.
    #[allow(clippy::too_many_arguments)]
    fn stream_experts(
        &self,
        rec: &mut Recorder,
        off: &Offload,
        i: usize,
        src: &ExpertSource,
        m: &Moe,
        t: u32,
        xq: Option<&XQuant>,
    ) -> Result<bool> {
        #[cfg(not(target_arch = "wasm32"))]
        {
            let gpu = &*self.model.gpu;
            let cfg = &self.model.config;
            let s = &self.s;
            let k = cfg.num_experts_per_tok;
            let hd = cfg.hidden_size;
            let slots = (m.gate_up.rows / (2 * cfg.moe_intermediate_size)) as u32;
            // The next layer, when it streams its experts too: prefetch.
            let next = match self.model.weights.layers.get(i + 1).map(|l| &l.mlp) {
                Some(super::load::Mlp::Moe(nm)) if off.prefetch && t == 1 => {
                    nm.source.as_ref().map(|ns| (&**nm, ns))
                }
                _ => None,
            };
            if let Some((nm, _)) = next {
                // The next layer's router on this layer's input predicts its choices.
                self.route(rec, nm, t, &s.prefetch_idx, &s.prefetch_weights, None);
            }
            // One readback: the routing, the prediction, and x where the CPU needs it, its
            // copies in the same submission as the work before them.
            let hybrid = off.hybrid_for(t as usize);
            let ids_bytes = (t as usize * k * 4) as u64;
            let mut parts = vec![(&s.router_idx, 0, ids_bytes)];
            if next.is_some() {
                parts.push((&s.prefetch_idx, 0, ids_bytes));
            }
            if hybrid {
                parts.push((&s.x, 0, (t as usize * hd * 4) as u64));
            }
            let read = rec.stage_read(&parts);
            // The previous hybrid layer's CPU outputs are written first (and its errors
            // reported here).
            rec.flush();
            gpu.check()?;
            let t0 = std::time::Instant::now();
            let mut got = gpu.read_staged(read)?.into_iter();
            let mut take = || got.next().unwrap_or_default();
            let ids: Vec<u32> = bytemuck::pod_collect_to_vec(&take());
            let predicted: Option<Vec<u32>> = next.map(|_| bytemuck::pod_collect_to_vec(&take()));
            let x: Vec<f32> = bytemuck::pod_collect_to_vec(&take());
            let first = off.first_layer() == Some(i);
            off.count_sync(t as usize, t0.elapsed().as_secs_f64(), first);
            let mut gpu_round =
                |table: &[u32], copies: &[BufferCopy], hybrid: bool| -> Result<()> {
                    // The uploads the GPU copies from the host copy, ahead of the matmuls. In
                    // a hybrid round they are the GPU's long part, which should end with the
                    // CPU's: submitted on their own, they start before the host records the
                    // matmuls.
                    rec.copy_all(copies);
                    if hybrid && !copies.is_empty() {
                        rec.flush();
                    }
                    // A hybrid round whose pairs all run on the CPU has no GPU experts.
                    if table.iter().any(|&x| x != crate::experts::NONE) {
                        gpu.write(&s.expert_slots, 0, bytemuck::cast_slice(table));
                        self.experts(rec, m, &s.expert_slots, slots, t, xq);
                    }
                    if let (Some(sh), true) = (&m.shared, hybrid) {
                        self.swiglu(rec, sh, t, xq);
                    }
                    rec.flush();
                    Ok(())
                };
            if hybrid {
                let weights = (&m.gate_up, &m.down);
                let started = off.serve_hybrid(
                    gpu,
                    i,
                    src,
                    ids,
                    t as usize,
                    weights,
                    |part| self.start_cpu_experts(part, x),
                    |table, c| gpu_round(table, c, true),
                )?;
                if let Some(cpu) = started {
                    self.await_cpu_experts(rec, cpu)?;
                }
            } else {
                let (gu, dn) = (&m.gate_up, &m.down);
                off.serve(gpu, i, src, ids, t as usize, gu, dn, |t, c| {
                    gpu_round(t, c, false)
                })?;
            }
            // Staged while the GPU runs this layer's experts and the next layer's attention.
            if let (Some((nm, ns)), Some(p)) = (next, predicted) {
                off.prefetch(gpu, i + 1, ns, p, &nm.gate_up, &nm.down)?;
            }
            Ok(hybrid)
        }
        #[cfg(target_arch = "wasm32")]
        {
            let _ = (rec, off, i, src, m, t, xq);
            Err(crate::error::Error::msg(
                "expert offloading needs to wait for the GPU mid-step, which the browser cannot",
            ))
        }
    }

    /// A hybrid round's CPU part (`part`, over the chunk's expert input `x`), started on the
    /// executor's threads: they run it while the host records and submits the round's GPU
    /// part and then what follows (the combine, the next layer's attention and router);
    /// [`Session::await_cpu_experts`] makes the next submission wait for it
    /// (`SPARSA_CPU_OVERLAP=0`: it runs there instead, on the host's thread, a measurement
    /// aid).
    #[cfg(not(target_arch = "wasm32"))]
    fn start_cpu_experts(&self, part: CpuPart, x: Vec<f32>) -> Result<CpuRun> {
        if !crate::knobs::knob_on!("SPARSA_CPU_OVERLAP") {
            return Ok(CpuRun::Later(part, x));
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let job = self.model.clone();
        let pairs: Vec<usize> = part.pairs().collect();
        offload(&self.model)?.spawn(move || {
            // A panic on the pool's thread would abort the process: it becomes the error.
            let got = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                run_cpu_part(&job, &part, &x)
            }))
            .unwrap_or_else(|_| {
                Err(crate::error::Error::msg(format!(
                    "layer {}: the CPU experts' job panicked",
                    part.layer
                )))
            });
            // The receiver may be gone (the step failed before it waited): nothing to do.
            let _ = tx.send(got);
        });
        Ok(CpuRun::Started(pairs, rx))
    }

    /// The outputs of a CPU part [`Session::start_cpu_experts`] started go into `s.moe_out`
    /// before the next submission: they arrive in one write to `cpu_out`, and each goes on to
    /// its pair's row of `moe_out` by a copy recorded now, ahead of the combine.
    #[cfg(not(target_arch = "wasm32"))]
    fn await_cpu_experts(&self, rec: &mut Recorder, cpu: CpuRun) -> Result<()> {
        let model = self.model.clone();
        let row = 4 * model.config.hidden_size as u64;
        let pairs: Vec<usize> = match &cpu {
            CpuRun::Later(part, _) => part.pairs().collect(),
            CpuRun::Started(pairs, _) => pairs.clone(),
        };
        for (j, p) in pairs.into_iter().enumerate() {
            rec.copy(
                &self.s.cpu_out,
                j as u64 * row,
                &self.s.moe_out,
                p as u64 * row,
                row,
            );
        }
        let out = self.s.cpu_out.clone();
        let write = move |model: &super::Model, off: &Offload| {
            off.with_cpu_outputs(|o| model.gpu.write(&out, 0, bytemuck::cast_slice(o)));
        };
        let off = offload(&model)?;
        let rx = match cpu {
            CpuRun::Later(part, x) => {
                let t0 = std::time::Instant::now();
                run_cpu_part(&model, &part, &x)?;
                off.count_cpu_wait(t0.elapsed().as_secs_f64());
                write(&model, off);
                return Ok(());
            }
            CpuRun::Started(_, rx) => rx,
        };
        let spin = model.gpu.spin_waits();
        rec.before_submit(move || {
            let t0 = std::time::Instant::now();
            let got = recv_polling(&rx, spin);
            let off = offload(&model)?;
            off.count_cpu_wait(t0.elapsed().as_secs_f64());
            got.map_err(|_| {
                crate::error::Error::msg("the CPU experts' job ended without a result")
            })??;
            write(&model, off);
            Ok(())
        });
        Ok(())
    }
}

/// A hybrid round's CPU part: running on the executor's threads (its pairs, and where its
/// result arrives), or left to run on the host's thread (`SPARSA_CPU_OVERLAP=0`).
#[cfg(not(target_arch = "wasm32"))]
enum CpuRun {
    Started(Vec<usize>, std::sync::mpsc::Receiver<Result<()>>),
    Later(CpuPart, Vec<f32>),
}

/// The model's expert cache (the closures that run a CPU part own the model and find the
/// cache and the layer in it again).
#[cfg(not(target_arch = "wasm32"))]
fn offload(model: &super::Model) -> Result<&Offload> {
    let off = model.offload.as_ref();
    off.ok_or_else(|| crate::error::Error::msg("CPU experts without an expert cache"))
}

/// `part` of a hybrid round over the expert input `x`, on the executor.
#[cfg(not(target_arch = "wasm32"))]
fn run_cpu_part(model: &super::Model, part: &CpuPart, x: &[f32]) -> Result<()> {
    let layer = model.weights.layer(part.layer).map(|l| &l.mlp);
    if let Some(super::load::Mlp::Moe(m)) = layer {
        if let Some(src) = &m.source {
            return offload(model)?.run_cpu(src, part, x, (&m.gate_up, &m.down));
        }
    }
    Err(crate::error::Error::msg(format!(
        "layer {}: CPU experts for a layer that does not stream its experts",
        part.layer
    )))
}

/// `rx.recv()`, polling first for up to [`crate::gpu::SPIN_LIMIT`] where `spin`
/// ([`crate::gpu::Gpu::spin_waits`]):
/// a hybrid round's CPU part ends a millisecond or two after the host starts waiting for it,
/// and a sleeping host thread would add its wake-up to every offloaded layer.
#[cfg(not(target_arch = "wasm32"))]
fn recv_polling<T>(
    rx: &std::sync::mpsc::Receiver<T>,
    spin: bool,
) -> std::result::Result<T, std::sync::mpsc::RecvError> {
    use std::sync::mpsc::TryRecvError;
    if spin {
        let t0 = std::time::Instant::now();
        while t0.elapsed() < crate::gpu::SPIN_LIMIT {
            match rx.try_recv() {
                Ok(v) => return Ok(v),
                Err(TryRecvError::Disconnected) => return Err(std::sync::mpsc::RecvError),
                Err(TryRecvError::Empty) => std::hint::spin_loop(),
            }
        }
    }
    rx.recv()
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::recv_polling;

    #[test]
    fn recv_polling_takes_a_late_value_and_reports_a_dropped_sender() {
        for spin in [true, false] {
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            let late = std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(3));
                tx.send(7).unwrap();
            });
            assert_eq!(recv_polling(&rx, spin), Ok(7));
            late.join().unwrap();
            // The sender is gone now.
            assert!(recv_polling(&rx, spin).is_err());
        }
    }
}
