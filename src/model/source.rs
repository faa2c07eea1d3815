//! Where a model comes from: a Hugging Face directory on disk, named files in memory (the
//! browser), or the small model compiled into the binary (`sparsa-bard-12m`, see
//! `models/sparsa-bard-12m/README.md`).
//!
//! A [`ModelSource`] holds everything a model directory offers besides the GPU: the parsed
//! config, the weight files (mapped, owned or static), the tokenizer and its config (for the
//! chat template). Nothing here touches a GPU, so bad input is refused before one is opened.

use crate::config::Config;
use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;
use crate::weights::WeightFiles;
use std::borrow::Cow;
#[cfg(not(target_arch = "wasm32"))]
use std::path::Path;
use std::path::PathBuf;

/// The name of the built-in model.
pub const BUILTIN_NAME: &str = "sparsa-bard-12m";

pub struct ModelSource {
    /// How errors and logs name this model: its directory, or `built-in sparsa-bard-12m`.
    pub label: String,
    /// The directory, when the model came from disk.
    pub dir: Option<PathBuf>,
    pub config: Config,
    pub weights: WeightFiles,
    tokenizer_json: Option<Cow<'static, [u8]>>,
    /// Text of `tokenizer_config.json`, if present (special tokens, `chat_template`).
    pub tokenizer_config: Option<String>,
    /// Text of `chat_template.jinja`, if present (wins over tokenizer_config's template).
    pub chat_template: Option<String>,
}

impl ModelSource {
    /// A Hugging Face model directory: `config.json`, safetensors (single or sharded),
    /// optionally `generation_config.json`, `tokenizer.json`, `tokenizer_config.json`,
    /// `chat_template.jinja`. Weights are memory-mapped, not read.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open(dir: &Path) -> Result<ModelSource> {
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {}
            // Says why: no such directory, a symlink loop, a permission.
            r => {
                return Err(Error::msg(format!(
                    "{}: {} (expected a model directory with config.json)",
                    dir.display(),
                    r.map_or_else(|e| e.to_string(), |_| "not a directory".into())
                )))
            }
        }
        let config = dir.join("config.json");
        match std::fs::metadata(&config) {
            Ok(m) if m.is_file() => {}
            Ok(_) => {
                return Err(Error::msg(format!(
                    "{}: not a file (expected the model's config)",
                    config.display()
                )))
            }
            // A dangling link or a link loop is not "no config.json".
            Err(e) if config.symlink_metadata().is_ok() => {
                return Err(Error::msg(format!(
                    "{}: cannot read: {e}",
                    config.display()
                )))
            }
            Err(_) => {
                return Err(Error::msg(format!(
                    "{}: no config.json (expected a Hugging Face model directory)",
                    dir.display()
                )))
            }
        }
        let config = Config::from_dir(dir)?;
        let weights = WeightFiles::open(dir)?;
        let read_bytes = |name: &str| -> Result<Option<Vec<u8>>> {
            let p = dir.join(name);
            if !p.exists() {
                return Ok(None);
            }
            std::fs::read(&p)
                .map(Some)
                .map_err(|e| Error::msg(format!("{}: cannot read: {e}", p.display())))
        };
        let read_text = |name: &str| -> Result<Option<String>> {
            match read_bytes(name)? {
                None => Ok(None),
                Some(b) => String::from_utf8(b).map(Some).map_err(|_| {
                    Error::msg(format!("{}: not UTF-8 text", dir.join(name).display()))
                }),
            }
        };
        Ok(ModelSource {
            label: dir.display().to_string(),
            dir: Some(dir.to_path_buf()),
            config,
            weights,
            tokenizer_json: read_bytes("tokenizer.json")?.map(Cow::Owned),
            tokenizer_config: read_text("tokenizer_config.json")?,
            chat_template: read_text("chat_template.jinja")?,
        })
    }

    /// The model compiled into this binary.
    #[cfg(feature = "embedded-model")]
    pub fn builtin() -> Result<ModelSource> {
        macro_rules! file {
            ($name:literal) => {
                include_bytes!(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/models/sparsa-bard-12m/",
                    $name
                ))
            };
        }
        let text = |b: &'static [u8], name: &str| -> Result<&'static str> {
            std::str::from_utf8(b)
                .map_err(|_| Error::msg(format!("built-in model: {name} is not UTF-8")))
        };
        let label = format!("built-in {BUILTIN_NAME}");
        let config = Config::from_texts(
            text(file!("config.json"), "config.json")?,
            &format!("{label}: config.json"),
            Some((
                text(file!("generation_config.json"), "generation_config.json")?,
                format!("{label}: generation_config.json"),
            )),
        )?;
        let weights = WeightFiles::from_static(&[(
            "built-in model.safetensors",
            file!("model.safetensors"),
        )])?;
        Ok(ModelSource {
            label,
            dir: None,
            config,
            weights,
            tokenizer_json: Some(Cow::Borrowed(file!("tokenizer.json"))),
            tokenizer_config: Some(
                text(file!("tokenizer_config.json"), "tokenizer_config.json")?.to_string(),
            ),
            chat_template: None,
        })
    }

    /// A model from named files in memory (the browser): `config.json`, `*.safetensors`
    /// (with `model.safetensors.index.json` ignored: every safetensors file given is used),
    /// and the optional files [`ModelSource::open`] reads.
    pub fn from_memory(label: &str, files: Vec<(String, Vec<u8>)>) -> Result<ModelSource> {
        let mut config_text = None;
        let mut gen_text = None;
        let mut tokenizer_json = None;
        let mut tokenizer_config = None;
        let mut chat_template = None;
        let mut weights = Vec::new();
        let utf8 = |name: &str, b: Vec<u8>| {
            String::from_utf8(b).map_err(|_| Error::msg(format!("{label}: {name} is not UTF-8")))
        };
        for (name, bytes) in files {
            match name.as_str() {
                "config.json" => config_text = Some(utf8(&name, bytes)?),
                "generation_config.json" => gen_text = Some(utf8(&name, bytes)?),
                "tokenizer.json" => tokenizer_json = Some(Cow::Owned(bytes)),
                "tokenizer_config.json" => tokenizer_config = Some(utf8(&name, bytes)?),
                "chat_template.jinja" => chat_template = Some(utf8(&name, bytes)?),
                n if n.ends_with(".safetensors") => weights.push((name, bytes)),
                _ => {}
            }
        }
        let config_text =
            config_text.ok_or_else(|| Error::msg(format!("{label}: no config.json")))?;
        if weights.is_empty() {
            return Err(Error::msg(format!("{label}: no .safetensors files")));
        }
        let config = Config::from_texts(
            &config_text,
            &format!("{label}: config.json"),
            gen_text
                .as_deref()
                .map(|t| (t, format!("{label}: generation_config.json"))),
        )?;
        Ok(ModelSource {
            label: label.to_string(),
            dir: None,
            config,
            weights: WeightFiles::from_owned(weights)?,
            tokenizer_json,
            tokenizer_config,
            chat_template,
        })
    }

    pub fn has_tokenizer(&self) -> bool {
        self.tokenizer_json.is_some()
    }

    /// The model's tokenizer, or an error saying it has none.
    pub fn tokenizer(&self) -> Result<Tokenizer> {
        match &self.tokenizer_json {
            Some(b) => Tokenizer::from_bytes(b)
                .map_err(|e| Error::msg(format!("{}: {e}", self.label))),
            None => Err(Error::msg(format!(
                "{}: no tokenizer.json (this model has no tokenizer; pass token ids with --tokens instead of --prompt)",
                self.label
            ))),
        }
    }
}

#[cfg(all(test, feature = "embedded-model"))]
mod tests {
    use super::*;

    #[test]
    fn builtin_model_parses_and_matches_its_directory() {
        let b = ModelSource::builtin().unwrap();
        let dir = crate::config::bard_dir();
        let d = ModelSource::open(&dir).unwrap();
        assert_eq!(b.config.num_hidden_layers, d.config.num_hidden_layers);
        assert_eq!(b.config.eos_token_ids, d.config.eos_token_ids);
        assert_eq!(b.weights.total_bytes(), d.weights.total_bytes());
        let t = b.tokenizer().unwrap();
        assert_eq!(
            t.encode("KING RICHARD:").unwrap(),
            d.tokenizer().unwrap().encode("KING RICHARD:").unwrap()
        );
    }

    #[test]
    fn from_memory_requires_config_and_weights() {
        let e = ModelSource::from_memory("upload", vec![])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("upload: no config.json"), "{e}");
        let cfg = std::fs::read(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("models/sparsa-bard-12m/config.json"),
        )
        .unwrap();
        let e = ModelSource::from_memory("upload", vec![("config.json".into(), cfg)])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("no .safetensors"), "{e}");
    }
}
