//! Measurement knobs: environment variables that override a kernel or scheduling choice, for
//! side-by-side runs on a real GPU (BENCHMARKS.md names the ones each figure used). Each is
//! read once per process where it is used; none is set by default, and in the browser none
//! is ever set.

/// `name`'s value if it is set, parses as a `u32` and passes `ok`.
pub fn env_u32(name: &str, ok: impl Fn(u32) -> bool) -> Option<u32> {
    std::env::var(name).ok()?.parse().ok().filter(|v| ok(*v))
}

/// [`env_u32`] read once by this call site: `knob!("SPARSA_X", |v| v <= 8)` is an
/// `Option<u32>`.
macro_rules! knob {
    ($name:expr, $ok:expr) => {{
        static CELL: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
        *CELL.get_or_init(|| $crate::knobs::env_u32($name, $ok))
    }};
}

/// A path that is on unless `name=0`, read once by this call site: `knob_on!("SPARSA_X")`.
macro_rules! knob_on {
    ($name:expr) => {
        $crate::knobs::knob!($name, |v| v <= 1) != Some(0)
    };
}

pub(crate) use {knob, knob_on};

/// The `SPARSA_*` environment variables of this process as `NAME=value`, sorted: the knobs
/// (and the adapter filter) a benchmark's figures ran under, which its report records.
pub fn environment() -> Vec<String> {
    let mut v: Vec<String> = std::env::vars()
        .filter(|(k, _)| k.starts_with("SPARSA_"))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    v.sort();
    v
}

#[cfg(test)]
mod tests {
    #[test]
    fn knobs_read_their_variable_once_and_check_it() {
        std::env::set_var("SPARSA_TEST_KNOB_A", "7");
        std::env::set_var("SPARSA_TEST_KNOB_B", "0");
        let read = || knob!("SPARSA_TEST_KNOB_A", |v| v < 10);
        assert_eq!(read(), Some(7));
        std::env::set_var("SPARSA_TEST_KNOB_A", "3");
        assert_eq!(read(), Some(7), "read once");
        assert_eq!(
            knob!("SPARSA_TEST_KNOB_A", |v| v > 5),
            None,
            "fails its check"
        );
        assert!(!knob_on!("SPARSA_TEST_KNOB_B"));
        assert!(knob_on!("SPARSA_TEST_KNOB_UNSET"));
        assert_eq!(super::env_u32("SPARSA_TEST_KNOB_UNSET", |_| true), None);
    }
}
