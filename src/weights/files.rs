//! Opening and validating safetensors files (single or sharded) without reading them.

use super::DType;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Bytes of one file: a read-only memory map natively, an owned buffer in the browser.
pub enum Storage {
    #[cfg(not(target_arch = "wasm32"))]
    Mapped(Mapped),
    Owned(Vec<u8>),
    /// Bytes compiled into the binary (the built-in model).
    Static(&'static [u8]),
}

/// A read-only map of a model file, registered with [`super::mapguard`] while it lives, and
/// the file's size and modification time when it was mapped.
#[cfg(not(target_arch = "wasm32"))]
pub struct Mapped {
    map: memmap2::Mmap,
    slot: Option<usize>,
    stamp: Option<(u64, std::time::SystemTime)>,
}

#[cfg(not(target_arch = "wasm32"))]
impl Drop for Mapped {
    fn drop(&mut self) {
        if let Some(s) = self.slot {
            super::mapguard::unregister(s);
        }
    }
}

/// Size and modification time of a file, to notice that it changed.
#[cfg(not(target_arch = "wasm32"))]
fn stamp(path: &Path) -> Option<(u64, std::time::SystemTime)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.len(), m.modified().ok()?))
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            #[cfg(not(target_arch = "wasm32"))]
            Storage::Mapped(m) => &m.map,
            Storage::Owned(v) => v,
            Storage::Static(b) => b,
        }
    }
}

struct File {
    path: PathBuf,
    storage: Storage,
}

#[derive(Clone)]
struct Entry {
    file: usize,
    dtype: safetensors::Dtype,
    shape: Vec<usize>,
    start: usize,
    end: usize,
}

/// All tensors of a model directory.
#[derive(Clone)]
pub struct WeightFiles {
    files: Arc<Vec<File>>,
    tensors: Arc<HashMap<String, Entry>>,
}

/// One tensor: its dtype, shape and bytes (inside the mapping).
#[derive(Clone)]
pub struct TensorRef<'a> {
    pub name: String,
    pub dtype: safetensors::Dtype,
    pub shape: Vec<usize>,
    pub bytes: &'a [u8],
    pub file: &'a Path,
}

impl TensorRef<'_> {
    pub fn dtype(&self) -> Result<DType> {
        DType::from_safetensors(
            self.dtype,
            &format!("{} in {}", self.name, self.file.display()),
        )
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// The tensor as f32 (for small tensors: norms, biases).
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        Ok(self.dtype()?.to_f32(self.bytes))
    }
    /// Fails unless the shape is `want`.
    pub fn expect_shape(&self, want: &[usize]) -> Result<&Self> {
        if self.shape != want {
            return Err(Error::msg(format!(
                "tensor {} in {}: shape {:?}, expected {:?} from config.json",
                self.name,
                self.file.display(),
                self.shape,
                want
            )));
        }
        Ok(self)
    }
}

/// Parse the text of a `model.safetensors.index.json` (`path` names it in errors): the shard
/// file names in order of first mention, and the map from tensor name to shard file name.
/// Shard names must be plain file names inside the model directory.
pub fn parse_shard_index(
    text: &str,
    path: &Path,
) -> Result<(Vec<String>, HashMap<String, String>)> {
    let v: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| Error::msg(format!("{}: invalid JSON: {e}", path.display())))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| Error::msg(format!("{}: missing object `weight_map`", path.display())))?;
    let mut names: Vec<String> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut wm = HashMap::new();
    for (k, f) in map {
        let f = f.as_str().ok_or_else(|| {
            Error::msg(format!(
                "{}: weight_map[{k:?}] is not a file name",
                path.display()
            ))
        })?;
        if f.is_empty() || f.contains('/') || f.contains('\\') || f.starts_with('.') {
            return Err(Error::msg(format!(
                "{}: weight_map[{k:?}] = {f:?} is not a plain file name in the model directory",
                path.display()
            )));
        }
        if seen.insert(f) {
            names.push(f.to_string());
        }
        wm.insert(k.clone(), f.to_string());
    }
    Ok((names, wm))
}

impl WeightFiles {
    /// Open the weights of a model directory: `model.safetensors.index.json` with its shards,
    /// else `model.safetensors`, else every `*.safetensors` in the directory.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open(dir: &Path) -> Result<WeightFiles> {
        let index = dir.join("model.safetensors.index.json");
        let mut names: Vec<String> = Vec::new();
        let mut weight_map: Option<HashMap<String, String>> = None;
        if index.exists() {
            let text = std::fs::read_to_string(&index)
                .map_err(|e| Error::msg(format!("{}: cannot read: {e}", index.display())))?;
            let (shards, wm) = parse_shard_index(&text, &index)?;
            names = shards;
            weight_map = Some(wm);
        } else if dir.join("model.safetensors").exists() {
            names.push("model.safetensors".into());
        } else {
            let rd = std::fs::read_dir(dir).map_err(|e| {
                Error::msg(format!("{}: cannot read directory: {e}", dir.display()))
            })?;
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().to_string();
                if n.ends_with(".safetensors") {
                    names.push(n);
                }
            }
            names.sort();
        }
        if names.is_empty() {
            return Err(Error::msg(format!(
                "{}: no weights (expected model.safetensors or model.safetensors.index.json)",
                dir.display()
            )));
        }
        let mut files = Vec::new();
        for n in &names {
            let path = dir.join(n);
            let f = std::fs::File::open(&path)
                .map_err(|e| Error::msg(format!("{}: cannot open: {e}", path.display())))?;
            if f.metadata().is_ok_and(|m| !m.is_file()) {
                return Err(Error::msg(format!(
                    "{}: not a file (expected safetensors weights)",
                    path.display()
                )));
            }
            // SAFETY: the map is read-only and sparsa never writes model files. Another
            // process may still change the file while it is mapped: contents that change
            // are caught by `check_unchanged` after the upload (size and modification time),
            // and a file that shrinks raises SIGBUS on access, which `mapguard` turns into
            // an error naming the file. The bytes are only ever read as plain integers and
            // floats, so no value can be invalid for its type.
            let map = unsafe { memmap2::Mmap::map(&f) }
                .map_err(|e| Error::msg(format!("{}: cannot map: {e}", path.display())))?;
            let slot = super::mapguard::register(map.as_ptr(), map.len(), &path);
            let stamp = stamp(&path);
            files.push(File {
                path,
                storage: Storage::Mapped(Mapped { map, slot, stamp }),
            });
        }
        let wf = Self::from_files(files)?;
        if let Some(wm) = weight_map {
            for (k, f) in &wm {
                let e = wf.tensors.get(k).ok_or_else(|| {
                    Error::msg(format!(
                        "{}: index names tensor {k} but that file does not hold it",
                        dir.join(f).display()
                    ))
                })?;
                if wf.files[e.file]
                    .path
                    .file_name()
                    .map(|x| x.to_string_lossy() != f.as_str())
                    .unwrap_or(true)
                {
                    return Err(Error::msg(format!(
                        "model.safetensors.index.json: tensor {k} is listed in {f} but found in {}",
                        wf.files[e.file].path.display()
                    )));
                }
            }
        }
        Ok(wf)
    }

    /// Weights from in-memory files (name, bytes): the browser path, and tests.
    pub fn from_owned(files: Vec<(String, Vec<u8>)>) -> Result<WeightFiles> {
        Self::from_files(
            files
                .into_iter()
                .map(|(n, b)| File {
                    path: PathBuf::from(n),
                    storage: Storage::Owned(b),
                })
                .collect(),
        )
    }

    /// Weights from files compiled into the binary (name, bytes).
    pub fn from_static(files: &[(&str, &'static [u8])]) -> Result<WeightFiles> {
        Self::from_files(
            files
                .iter()
                .map(|(n, b)| File {
                    path: PathBuf::from(n),
                    storage: Storage::Static(b),
                })
                .collect(),
        )
    }

    fn from_files(files: Vec<File>) -> Result<WeightFiles> {
        let mut tensors: HashMap<String, Entry> = HashMap::new();
        for (i, f) in files.iter().enumerate() {
            let bytes = f.storage.bytes();
            let (n, meta) = safetensors::SafeTensors::read_metadata(bytes).map_err(|e| {
                Error::msg(format!(
                    "{}: not a valid safetensors file: {}",
                    f.path.display(),
                    explain(bytes, e)
                ))
            })?;
            let base = 8 + n;
            for (name, info) in meta.tensors() {
                let (s, e) = info.data_offsets;
                // read_metadata already checks that the offsets tile the data section; a
                // tensor must still never slice outside its file, whatever that crate accepts.
                let (start, end) = match (base.checked_add(s), base.checked_add(e)) {
                    (Some(start), Some(end)) if start <= end && end <= bytes.len() => (start, end),
                    _ => {
                        return Err(Error::msg(format!(
                            "{}: tensor {name}: data_offsets [{s}, {e}] lie outside the file's {} data bytes",
                            f.path.display(),
                            bytes.len().saturating_sub(base)
                        )))
                    }
                };
                let entry = Entry {
                    file: i,
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    start,
                    end,
                };
                if let Some(prev) = tensors.insert(name.clone(), entry) {
                    return Err(Error::msg(format!(
                        "tensor {name} appears twice: in {} and {}",
                        files[prev.file].path.display(),
                        f.path.display()
                    )));
                }
            }
        }
        Ok(WeightFiles {
            files: Arc::new(files),
            tensors: Arc::new(tensors),
        })
    }

    /// Fails if a mapped file's size or modification time differs from when it was opened
    /// (another program wrote it meanwhile, so what was read may mix old and new bytes).
    pub fn check_unchanged(&self) -> Result<()> {
        #[cfg(not(target_arch = "wasm32"))]
        for f in self.files.iter() {
            if let Storage::Mapped(m) = &f.storage {
                if m.stamp.is_some() && stamp(&f.path) != m.stamp {
                    return Err(Error::msg(format!(
                        "{}: the file changed while sparsa was reading it; run again once it is complete",
                        f.path.display()
                    )));
                }
            }
        }
        Ok(())
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(|s| s.as_str())
    }

    /// The tensor `name`, or an error naming it.
    pub fn get(&self, name: &str) -> Result<TensorRef<'_>> {
        let e = self
            .tensors
            .get(name)
            .ok_or_else(|| Error::msg(format!("tensor {name} is missing from the model files")))?;
        let f = &self.files[e.file];
        Ok(TensorRef {
            name: name.to_string(),
            dtype: e.dtype,
            shape: e.shape.clone(),
            bytes: &f.storage.bytes()[e.start..e.end],
            file: &f.path,
        })
    }

    /// Total bytes of all tensors.
    pub fn total_bytes(&self) -> u64 {
        self.tensors
            .values()
            .map(|e| (e.end - e.start) as u64)
            .sum()
    }
}

/// What is wrong with a file that the safetensors crate refused, in words that name the
/// tensor and the numbers at fault (the crate's errors name neither sizes nor, mostly, tensors).
fn explain(bytes: &[u8], e: safetensors::SafeTensorError) -> String {
    use safetensors::SafeTensorError as E;
    let len = bytes.len() as u64;
    let n = bytes
        .get(..8)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(u64::from_le_bytes)
        .unwrap_or(0);
    match e {
        E::HeaderTooSmall if len == 0 => {
            "the file is empty (expected an 8-byte header length, a JSON header, then the tensor data)".into()
        }
        E::HeaderTooSmall => format!("{len} bytes, too short to hold the 8-byte header length"),
        E::HeaderTooLarge | E::InvalidHeaderLength if n > len.saturating_sub(8) => format!(
            "the header length field says {n} bytes, but the file holds {} bytes after it (truncated, or not a safetensors file)",
            len.saturating_sub(8)
        ),
        E::HeaderTooLarge => format!("the header length {n} exceeds safetensors' 100 MB limit"),
        E::InvalidHeader(u) => format!("the header is not UTF-8 text ({u})"),
        E::InvalidHeaderStart => "the header does not start with '{'".into(),
        E::InvalidHeaderDeserialization(j) => {
            format!("the header is not the expected JSON object of tensors: {j}")
        }
        other => match check_entries(bytes, n) {
            Some(what) => what,
            None => format!("{other:?}"),
        },
    }
}

/// Finds the first tensor whose entry is inconsistent (offsets, byte count, overflow) or the
/// data section's size mismatch, reading the header again (it is known to be valid JSON).
fn check_entries(bytes: &[u8], n: u64) -> Option<String> {
    let header = bytes.get(8..usize::try_from(n).ok()?.checked_add(8)?)?;
    let map: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(header).ok()?;
    let mut entries: Vec<(&String, safetensors::Dtype, Vec<u64>, u64, u64)> = Vec::new();
    for (name, v) in &map {
        if name == "__metadata__" {
            continue;
        }
        let dtype: safetensors::Dtype = serde_json::from_value(v.get("dtype")?.clone()).ok()?;
        let shape: Vec<u64> = serde_json::from_value(v.get("shape")?.clone()).ok()?;
        let off: [u64; 2] = serde_json::from_value(v.get("data_offsets")?.clone()).ok()?;
        entries.push((name, dtype, shape, off[0], off[1]));
    }
    for (name, dtype, shape, s, e) in &entries {
        let bits = shape
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .and_then(|x| x.checked_mul(dtype.bitsize() as u64));
        let Some(bits) = bits else {
            return Some(format!(
                "tensor {name}: shape {shape:?} has more elements than any file can hold"
            ));
        };
        if e < s {
            return Some(format!(
                "tensor {name}: data_offsets [{s}, {e}] end before they start"
            ));
        }
        if bits % 8 != 0 || e - s != bits / 8 {
            return Some(format!(
                "tensor {name}: data_offsets [{s}, {e}] hold {} bytes, but {dtype:?} {shape:?} needs {}",
                e - s,
                bits as f64 / 8.0
            ));
        }
    }
    let data = (bytes.len() as u64).checked_sub(n.checked_add(8)?)?;
    // With room for every tensor, one that ends past the data is out of bounds (without
    // room, the file is truncated: said below).
    if entries
        .iter()
        .map(|x| x.4 - x.3)
        .fold(0u64, u64::saturating_add)
        <= data
    {
        if let Some((name, _, _, s, e)) = entries.iter().find(|x| x.4 > data) {
            return Some(format!(
                "tensor {name}: data_offsets [{s}, {e}] point past the end of the data ({data} bytes)"
            ));
        }
    }
    entries.sort_by_key(|x| (x.3, x.4));
    let mut end = 0;
    for (name, _, _, s, e) in &entries {
        if *s != end {
            return Some(format!(
                "tensor {name}: data_offsets [{s}, {e}] {} (tensors must be stored back to back from offset 0)",
                if *s < end { format!("overlap the previous tensor, which ends at {end}") } else { format!("leave a gap after the previous tensor, which ends at {end}") }
            ));
        }
        end = *e;
    }
    if data < end {
        return Some(format!(
            "truncated: the header's tensors need {end} bytes of data, the file holds {data}"
        ));
    }
    if data > end {
        return Some(format!(
            "{} bytes after the last tensor (the header's tensors end at {end} of {data} data bytes)",
            data - end
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(names: &[&str]) -> Vec<u8> {
        let data = vec![0u8; 8];
        let views: Vec<(String, safetensors::tensor::TensorView)> = names
            .iter()
            .map(|n| {
                (
                    n.to_string(),
                    safetensors::tensor::TensorView::new(
                        safetensors::Dtype::BF16,
                        vec![2, 2],
                        &data,
                    )
                    .unwrap(),
                )
            })
            .collect();
        safetensors::serialize(views, None).unwrap()
    }

    #[test]
    fn finds_tensors_across_files() {
        let w = WeightFiles::from_owned(vec![
            ("a".into(), file(&["x", "y"])),
            ("b".into(), file(&["z"])),
        ])
        .unwrap();
        assert!(w.contains("x") && w.contains("z"));
        let t = w.get("z").unwrap();
        assert_eq!(
            (t.shape.clone(), t.bytes.len(), t.dtype().unwrap()),
            (vec![2, 2], 8, DType::BF16)
        );
        assert!(t.expect_shape(&[4]).err().unwrap().0.contains("z"));
        let e = w.get("nope").err().unwrap().0;
        assert!(e.contains("nope") && e.contains("missing"), "{e}");
    }

    #[test]
    fn duplicate_tensor_is_an_error() {
        let e =
            WeightFiles::from_owned(vec![("a".into(), file(&["x"])), ("b".into(), file(&["x"]))])
                .err()
                .unwrap()
                .0;
        assert!(e.contains("x") && e.contains("twice"), "{e}");
    }

    #[test]
    fn shard_index_is_parsed_and_checked() {
        let p = Path::new("m/model.safetensors.index.json");
        let (names, wm) = parse_shard_index(
            r#"{"metadata": {}, "weight_map": {"a": "s2", "b": "s1", "c": "s2"}}"#,
            p,
        )
        .unwrap();
        assert_eq!(names, ["s2", "s1"]);
        assert_eq!(wm["c"], "s2");
        for (text, want) in [
            ("{", "m/model.safetensors.index.json: invalid JSON"),
            (
                "[]",
                "m/model.safetensors.index.json: missing object `weight_map`",
            ),
            (
                r#"{"weight_map": {"a": 1}}"#,
                r#"weight_map["a"] is not a file name"#,
            ),
            (
                r#"{"weight_map": {"a": "../x"}}"#,
                "is not a plain file name",
            ),
            (
                r#"{"weight_map": {"a": "d\\x"}}"#,
                "is not a plain file name",
            ),
            (
                r#"{"weight_map": {"a": ""}}"#,
                r#"weight_map["a"] = "" is not a plain file name"#,
            ),
        ] {
            let e = parse_shard_index(text, p).err().unwrap().0;
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn truncated_file_is_an_error() {
        let mut f = file(&["x"]);
        f.truncate(f.len() - 3);
        let e = WeightFiles::from_owned(vec![("shard.safetensors".into(), f)])
            .err()
            .unwrap()
            .0;
        assert!(e.contains("shard.safetensors"), "{e}");
    }
}
