//! Host-side RoPE tables: inverse frequencies (default and YaRN) and the per-position
//! cos/sin rows that the `rope` kernel reads. Computed in f32 the way transformers does,
//! so the GPU never evaluates trig functions on large arguments.

use crate::config::{yarn_get_mscale, Config, RopeKind};

pub struct RopeTable {
    /// One inverse frequency per rotated pair (`qk_rope_head_dim / 2`).
    pub inv_freq: Vec<f32>,
    /// Multiplies cos and sin (YaRN's attention factor; 1 otherwise).
    pub attention_factor: f32,
}

impl RopeTable {
    pub fn new(cfg: &Config) -> RopeTable {
        let dim = cfg.qk_rope_head_dim;
        let base = cfg.rope.theta;
        // `base ** (arange(0, dim, 2) / dim)` in f32, as transformers computes it.
        let pos_freqs: Vec<f32> = (0..dim / 2)
            .map(|i| (base as f32).powf((2 * i) as f32 / dim as f32))
            .collect();
        match cfg.rope.kind {
            RopeKind::Default => RopeTable {
                inv_freq: pos_freqs.iter().map(|p| 1.0 / p).collect(),
                attention_factor: 1.0,
            },
            RopeKind::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                mscale,
                mscale_all_dim,
                attention_factor,
                truncate,
            } => {
                let attention_factor =
                    attention_factor.unwrap_or_else(|| match (mscale, mscale_all_dim) {
                        (Some(m), Some(a)) if m != 0.0 && a != 0.0 => {
                            yarn_get_mscale(factor, m) / yarn_get_mscale(factor, a)
                        }
                        _ => yarn_get_mscale(factor, 1.0),
                    });
                let d = dim as f64;
                let corr = |rot: f64| {
                    (d * (original_max_position_embeddings / (rot * 2.0 * std::f64::consts::PI))
                        .ln())
                        / (2.0 * base.ln())
                };
                let (mut low, mut high) = (corr(beta_fast), corr(beta_slow));
                if truncate {
                    low = low.floor();
                    high = high.ceil();
                }
                let low = low.max(0.0);
                let mut high = high.min(d - 1.0);
                if low == high {
                    high += 0.001;
                }
                let inv_freq = pos_freqs
                    .iter()
                    .enumerate()
                    .map(|(i, p)| {
                        let ramp = (((i as f32) - low as f32) / (high as f32 - low as f32))
                            .clamp(0.0, 1.0);
                        let extra = 1.0 - ramp;
                        let inv_extra = 1.0 / p;
                        let inv_inter = 1.0 / (factor as f32 * p);
                        inv_inter * (1.0 - extra) + inv_extra * extra
                    })
                    .collect();
                RopeTable {
                    inv_freq,
                    attention_factor: attention_factor as f32,
                }
            }
        }
    }

    /// `(cos, sin)` pairs for each position, laid out as the `rope` kernel expects:
    /// `[positions.len(), dim / 2, 2]`.
    pub fn cos_sin(&self, positions: impl Iterator<Item = usize>) -> Vec<f32> {
        let mut out = Vec::new();
        for p in positions {
            for f in &self.inv_freq {
                let ang = p as f32 * f;
                out.push(ang.cos() * self.attention_factor);
                out.push(ang.sin() * self.attention_factor);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yarn_matches_transformers() {
        // tests/data/dsv32: theta 1e4, dim 16, factor 40, original 96, beta 32/1,
        // mscale 1, mscale_all_dim 0.8; values printed by transformers 5.24.0's
        // ROPE_INIT_FUNCTIONS["yarn"].
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/dsv32");
        let cfg = Config::from_dir(&dir).unwrap();
        let t = RopeTable::new(&cfg);
        let want = [
            1.0,
            0.2134537249803543,
            0.034999996423721313,
            0.0007905694656074047,
            0.0002500000118743628,
            7.905694656074047e-05,
            2.499999936844688e-05,
            7.905694474175107e-06,
        ];
        for (g, w) in t.inv_freq.iter().zip(want) {
            assert!((*g as f64 - w).abs() <= 1e-6 * w, "inv_freq {g} vs {w}");
        }
        assert!((t.attention_factor as f64 - 1.0569662567531275).abs() < 1e-6);
        let cs = t.cos_sin([0usize, 5].into_iter());
        assert_eq!(cs.len(), 2 * 16);
        assert!((cs[0] - t.attention_factor).abs() < 1e-7 && cs[1] == 0.0);
        assert!((cs[16] - 5f32.cos() * t.attention_factor).abs() < 1e-6);
    }

    #[test]
    fn default_rope() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/glm5");
        let cfg = Config::from_dir(&dir).unwrap();
        let t = RopeTable::new(&cfg);
        assert_eq!(t.attention_factor, 1.0);
        let d = cfg.qk_rope_head_dim as f64;
        for (i, f) in t.inv_freq.iter().enumerate() {
            let w = 1.0 / cfg.rope.theta.powf(2.0 * i as f64 / d);
            assert!((*f as f64 - w).abs() <= 1e-6 * w);
        }
    }
}
