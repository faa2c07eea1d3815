//! Quality of a quantized model against the model it came from, on the same GPU:
//! max |Δlogit|, top-1 agreement over every position, perplexity of the sequences (next
//! token NLL), and greedy agreement (tokens equal until the first divergence, and per
//! position). docs/QUANTIZATION.md has the numbers and the commands.
//!
//! cargo run --release --example quant_eval -- BASE_DIR QUANT_DIR TOKENS.json [GREEDY_N]
//! TOKENS.json: a JSON list of token-id lists (each ≥ 2 tokens).
//!
//! With `SPARSA_EVAL_BASE_EXACT=1` the base model runs on a device of its own whose prefill
//! is exact (`Gpu::set_exact_gemms`, as `--exact-gemms`), the other with the defaults: with
//! QUANT_DIR = BASE_DIR this measures the default prefill's own rounding.
use sparsa::generate::{generate, Sampler, SamplingParams};
use sparsa::gpu::Gpu;
use sparsa::model::{Model, ModelSource};
use std::sync::Arc;

fn nll_and_logits(model: &Model, ids: &[u32]) -> (Vec<f64>, Vec<f32>) {
    let mut s = model.session(ids.len()).expect("session");
    let l = s.forward(ids, true).expect("forward");
    let nll = (0..ids.len() - 1)
        .map(|j| {
            let row = l.row(j);
            let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
            let lse = m + row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln();
            lse - row[ids[j + 1] as usize] as f64
        })
        .collect();
    (nll, l.data)
}

fn greedy(model: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut s = model.session(prompt.len() + n).expect("session");
    let mut sampler = Sampler::new(SamplingParams::default());
    generate(&mut s, prompt, n, &mut sampler, &[], |_| true)
        .expect("generate")
        .0
}

fn main() -> sparsa::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 4 {
        eprintln!("usage: quant_eval BASE_DIR QUANT_DIR TOKENS.json [GREEDY_N]");
        std::process::exit(2);
    }
    let seqs: Vec<Vec<u32>> = serde_json::from_slice(&std::fs::read(&a[3]).expect("tokens file"))
        .expect("a JSON list of token lists");
    let n_greedy: usize = a.get(4).map_or(32, |s| s.parse().expect("GREEDY_N"));
    let gpu = Arc::new(Gpu::new(None)?);
    let base_gpu = match std::env::var("SPARSA_EVAL_BASE_EXACT").as_deref() {
        Ok("1") => {
            let g = Arc::new(Gpu::new(None)?);
            g.set_exact_gemms(true);
            g
        }
        _ => gpu.clone(),
    };
    let base = Model::from_source(&ModelSource::open(a[1].as_ref())?, base_gpu, &mut |_, _| {})?;
    let quant = Model::from_source(&ModelSource::open(a[2].as_ref())?, gpu, &mut |_, _| {})?;
    let v = base.config.vocab_size;
    let (mut max_d, mut agree, mut pos) = (0f32, 0usize, 0usize);
    let (mut nb, mut nq, mut nt) = (0f64, 0f64, 0usize);
    let (mut g_prefix, mut g_same, mut g_total) = (0usize, 0usize, 0usize);
    for ids in &seqs {
        let (lb, xb) = nll_and_logits(&base, ids);
        let (lq, xq) = nll_and_logits(&quant, ids);
        for (rb, rq) in xb.chunks(v).zip(xq.chunks(v)) {
            for (p, q) in rb.iter().zip(rq) {
                max_d = max_d.max((p - q).abs());
            }
            agree += (sparsa::generate::argmax(rb) == sparsa::generate::argmax(rq)) as usize;
            pos += 1;
        }
        nb += lb.iter().sum::<f64>();
        nq += lq.iter().sum::<f64>();
        nt += lb.len();
        let gb = greedy(&base, &ids[..ids.len().min(8)], n_greedy);
        let gq = greedy(&quant, &ids[..ids.len().min(8)], n_greedy);
        g_prefix += gb.iter().zip(&gq).take_while(|(x, y)| x == y).count();
        g_same += gb.iter().zip(&gq).filter(|(x, y)| x == y).count();
        g_total += gb.len();
    }
    let (pb, pq) = ((nb / nt as f64).exp(), (nq / nt as f64).exp());
    println!(
        "{{\"max_abs_dlogit\": {max_d:.4}, \"top1_agreement\": {:.4}, \"positions\": {pos}, \"ppl_base\": {pb:.4}, \"ppl_quant\": {pq:.4}, \"ppl_delta_pct\": {:.3}, \"greedy_prefix\": {:.4}, \"greedy_same\": {:.4}, \"greedy_tokens\": {g_total}}}",
        agree as f64 / pos as f64,
        100.0 * (pq / pb - 1.0),
        g_prefix as f64 / g_total as f64,
        g_same as f64 / g_total as f64,
    );
    Ok(())
}
