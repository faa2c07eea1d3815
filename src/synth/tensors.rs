//! The tensors of a synthetic model: Hugging Face names, shapes, initial values and how each is
//! stored in each format.

use crate::config::Config;
use crate::quantize::{default_keep, TensorHeader};
use crate::weights::QFormat;

/// How a tensor's values are drawn.
#[derive(Debug, Clone, Copy)]
pub(super) enum Init {
    /// Uniform in (−a, a).
    Uniform(f32),
    Const(f32),
}

/// How its bytes are stored.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Store {
    Bf16,
    F32,
    Fp8,
    Fp8ScaleInv,
    Quant,
    QuantScale,
}

pub(super) struct Tensor {
    pub(super) header: TensorHeader,
    /// The values' source: the weight's name (scale tensors share their weight's values).
    pub(super) seed_name: String,
    pub(super) rows: usize,
    pub(super) cols: usize,
    pub(super) init: Init,
    pub(super) store: Store,
}

/// FP8 scales as powers of two (DeepSeek's `scale_fmt: ue8m0`) rather than amax / 448.
pub(super) fn ue8m0(cfg: &Config) -> bool {
    cfg.family == crate::config::Family::DeepseekV32
}

/// Whether the FP8 releases quantize this tensor (see tests/reference/make_fp8_goldens.py).
fn fp8_quantized(name: &str) -> bool {
    let Some(rest) = name
        .strip_prefix("model.layers.")
        .and_then(|r| r.split_once('.'))
        .map(|(_, r)| r)
    else {
        return false;
    };
    let attn = [
        "self_attn.q_a_proj.weight",
        "self_attn.q_b_proj.weight",
        "self_attn.kv_a_proj_with_mqa.weight",
        "self_attn.kv_b_proj.weight",
        "self_attn.o_proj.weight",
        "self_attn.indexer.wq_b.weight",
        "self_attn.indexer.wk.weight",
    ];
    attn.contains(&rest)
        || (rest.starts_with("mlp.")
            && ["gate_proj.weight", "up_proj.weight", "down_proj.weight"]
                .iter()
                .any(|s| rest.ends_with(&format!(".{s}"))))
}

/// The logical tensors of a model (name, shape, init), in file order.
fn logical_tensors(cfg: &Config) -> Vec<(String, Vec<usize>, Init)> {
    let u = |fan_in: usize| Init::Uniform((3.0 / fan_in as f32).sqrt());
    let ones = Init::Const(1.0);
    let small = Init::Uniform(0.01);
    let (h, v) = (cfg.hidden_size, cfg.vocab_size);
    let heads = cfg.num_attention_heads;
    let (dn, dr, dv) = (cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim);
    let (ql, kl) = (cfg.q_lora_rank, cfg.kv_lora_rank);
    let mut t: Vec<(String, Vec<usize>, Init)> = vec![(
        "model.embed_tokens.weight".into(),
        vec![v, h],
        Init::Uniform(3f32.sqrt()),
    )];
    let swiglu = |t: &mut Vec<(String, Vec<usize>, Init)>, p: &str, inter: usize| {
        t.push((format!("{p}.gate_proj.weight"), vec![inter, h], u(h)));
        t.push((format!("{p}.up_proj.weight"), vec![inter, h], u(h)));
        t.push((format!("{p}.down_proj.weight"), vec![h, inter], u(inter)));
    };
    for i in 0..cfg.cache_layers() {
        let p = format!("model.layers.{i}");
        let a = format!("{p}.self_attn");
        let mtp = i == cfg.num_hidden_layers;
        if mtp {
            // The MTP layer's own tensors, then a full MoE decoder layer.
            t.push((format!("{p}.enorm.weight"), vec![h], ones));
            t.push((format!("{p}.hnorm.weight"), vec![h], ones));
            t.push((format!("{p}.eh_proj.weight"), vec![h, 2 * h], u(2 * h)));
            t.push((format!("{p}.shared_head.norm.weight"), vec![h], ones));
        }
        t.push((format!("{p}.input_layernorm.weight"), vec![h], ones));
        t.push((format!("{a}.q_a_proj.weight"), vec![ql, h], u(h)));
        t.push((format!("{a}.q_a_layernorm.weight"), vec![ql], ones));
        t.push((
            format!("{a}.q_b_proj.weight"),
            vec![heads * (dn + dr), ql],
            u(ql),
        ));
        t.push((
            format!("{a}.kv_a_proj_with_mqa.weight"),
            vec![kl + dr, h],
            u(h),
        ));
        t.push((format!("{a}.kv_a_layernorm.weight"), vec![kl], ones));
        t.push((
            format!("{a}.kv_b_proj.weight"),
            vec![heads * (dn + dv), kl],
            u(kl),
        ));
        t.push((
            format!("{a}.o_proj.weight"),
            vec![h, heads * dv],
            u(heads * dv),
        ));
        if cfg.has_keys(i) {
            let x = format!("{a}.indexer");
            let (ih, id) = (cfg.index_n_heads, cfg.index_head_dim);
            t.push((format!("{x}.wq_b.weight"), vec![ih * id, ql], u(ql)));
            t.push((format!("{x}.wk.weight"), vec![id, h], u(h)));
            t.push((format!("{x}.k_norm.weight"), vec![id], ones));
            t.push((format!("{x}.k_norm.bias"), vec![id], small));
            t.push((format!("{x}.weights_proj.weight"), vec![ih, h], u(h)));
        }
        t.push((
            format!("{p}.post_attention_layernorm.weight"),
            vec![h],
            ones,
        ));
        let m = format!("{p}.mlp");
        if !mtp && cfg.is_dense_layer(i) {
            swiglu(&mut t, &m, cfg.intermediate_size);
        } else {
            let e = cfg.n_routed_experts;
            t.push((format!("{m}.gate.weight"), vec![e, h], u(h)));
            t.push((format!("{m}.gate.e_score_correction_bias"), vec![e], small));
            for x in 0..e {
                swiglu(
                    &mut t,
                    &format!("{m}.experts.{x}"),
                    cfg.moe_intermediate_size,
                );
            }
            if cfg.n_shared_experts > 0 {
                swiglu(
                    &mut t,
                    &format!("{m}.shared_experts"),
                    cfg.moe_intermediate_size * cfg.n_shared_experts,
                );
            }
        }
    }
    t.push(("model.norm.weight".into(), vec![h], ones));
    if !cfg.tie_word_embeddings {
        t.push(("lm_head.weight".into(), vec![v, h], u(h)));
    }
    t
}

/// The stored tensors of `cfg` in `format`, in file order.
pub(super) fn stored_tensors(cfg: &Config, format: Option<QFormat>) -> Vec<Tensor> {
    let mut out = Vec::new();
    for (name, shape, init) in logical_tensors(cfg) {
        let (rows, cols) = match shape[..] {
            [r, c] => (r, c),
            _ => (1, shape.iter().product()),
        };
        let f32_bias = name.ends_with("e_score_correction_bias");
        let plain = |store: Store| {
            let es = if store == Store::F32 { 4 } else { 2 };
            Tensor {
                header: TensorHeader {
                    name: name.clone(),
                    dtype: if store == Store::F32 { "F32" } else { "BF16" },
                    shape: shape.clone(),
                    bytes: (rows * cols * es) as u64,
                },
                seed_name: name.clone(),
                rows,
                cols,
                init,
                store,
            }
        };
        if f32_bias {
            out.push(plain(Store::F32));
            continue;
        }
        let matrix = shape.len() == 2;
        match format {
            Some(q) if matrix && quantized(q, &name) => {
                let (weight, scale) = if q == QFormat::Fp8 {
                    (Store::Fp8, Store::Fp8ScaleInv)
                } else {
                    (Store::Quant, Store::QuantScale)
                };
                for (header, store) in TensorHeader::quantized(&name, q, rows, cols)
                    .into_iter()
                    .zip([weight, scale])
                {
                    out.push(Tensor {
                        header,
                        seed_name: name.clone(),
                        rows,
                        cols,
                        init,
                        store,
                    });
                }
            }
            _ => out.push(plain(Store::Bf16)),
        }
    }
    out
}

/// Whether a matrix is stored quantized: the tensors the FP8 releases quantize, or for
/// q8 / q4 everything `sparsa quantize` does not keep by default.
fn quantized(q: QFormat, name: &str) -> bool {
    match q {
        QFormat::Fp8 => fp8_quantized(name),
        QFormat::Q8 { .. } | QFormat::Q4 { .. } => !default_keep(name),
    }
}
