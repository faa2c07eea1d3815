//! The library's modules form floors, and no module reaches up: every `crate::…` path in a
//! module of `src/` names a module on a lower floor (the README's "Architecture" section
//! draws the same map). A new top-level module must be given its floor here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Floors, lowest first: a module may use the modules of the floors below its own. The
/// binary (`src/cli/`, the eleventh floor) uses the library from outside, as `sparsa::`.
const FLOORS: &[&[&str]] = &[
    &["error", "fault", "knobs", "testutil"],
    &["gpu", "sampling", "tokenizer"],
    &["weights"],
    &["config"],
    &["experts", "kernels"],
    &["cache"],
    &["model"],
    &["generate", "quantize"],
    &["chat", "synth"],
    &["bench", "fuzzing", "serve"],
];

fn floor_of(module: &str) -> Option<usize> {
    FLOORS.iter().position(|f| f.contains(&module))
}

/// `.rs` files under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The source without comments (line comments, doc comments and block comments).
fn strip_comments(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let b = s.as_bytes();
    let (mut i, mut in_str) = (0, false);
    while i < b.len() {
        if in_str {
            if b[i] == b'\\' {
                out.push_str(&s[i..(i + 2).min(b.len())]);
                i += 2;
                continue;
            }
            in_str = b[i] != b'"';
        } else if b[i] == b'"' {
            in_str = true;
        } else if s[i..].starts_with("//") {
            i += s[i..].find('\n').unwrap_or(s.len() - i);
            continue;
        } else if s[i..].starts_with("/*") {
            i += s[i..].find("*/").map_or(s.len() - i, |j| j + 2);
            continue;
        }
        let c = s[i..].chars().next().unwrap();
        out.push(c);
        i += c.len_utf8();
    }
    out
}

/// The top-level modules a source names through `crate::` (`crate::a::…` and each item of
/// `crate::{a, b::c, …}`).
fn crate_uses(src: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = src;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Items at depth 0 of the braces.
            let (mut depth, mut item_start) = (0, true);
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        rest = &group[j..];
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && (c.is_ascii_alphabetic() || c == '_') => {
                        let name: String = group[j..]
                            .chars()
                            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                            .collect();
                        names.push(name);
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            names.push(name);
        }
    }
    names
}

#[test]
fn no_module_uses_one_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut violations = Vec::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let module = first.trim_end_matches(".rs").to_string();
        // The binary (its own crate: it uses the library as `sparsa::`) and the crate root.
        if module == "cli" || module == "lib" {
            continue;
        }
        let Some(floor) = floor_of(&module) else {
            violations.push(format!("src/{module}: not on any floor of tests/layers.rs"));
            continue;
        };
        let text = strip_comments(&std::fs::read_to_string(f).unwrap());
        for used in crate_uses(&text) {
            *seen.entry(used.clone()).or_default() += 1;
            if used == module || used == "Result" || used == "Error" {
                continue;
            }
            match floor_of(&used) {
                Some(g) if g < floor => {}
                Some(g) => violations.push(format!(
                    "{}: {module} (floor {floor}) uses crate::{used} (floor {g})",
                    rel.display()
                )),
                None => violations.push(format!(
                    "{}: crate::{used} is not on any floor of tests/layers.rs",
                    rel.display()
                )),
            }
        }
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
    // The scan found the uses it should (it cannot pass by reading nothing).
    for m in ["gpu", "kernels", "model", "weights", "config"] {
        assert!(
            seen.get(m).is_some_and(|&n| n >= 5),
            "few uses of {m}: {seen:?}"
        );
    }
}

#[test]
fn the_scanner_reads_paths_groups_and_skips_comments() {
    let s = strip_comments(
        "use crate::gpu::Gpu; // crate::model\n/* crate::chat */ use crate::{a::{b, c}, d, e::f};",
    );
    assert_eq!(crate_uses(&s), ["gpu", "a", "d", "e"]);
}
