//! One error type for the whole library: a single human-readable line that names the
//! file, tensor, field or flag at fault and what was expected.

use std::fmt;

#[derive(Debug, Clone)]
pub struct Error(pub String);

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn msg(m: impl Into<String>) -> Self {
        Error(m.into())
    }
    /// Prefix the message with context ("loading config.json: …").
    pub fn context(self, c: impl fmt::Display) -> Self {
        Error(format!("{c}: {}", self.0))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error(e.to_string())
    }
}

thread_local! {
    /// Whether this thread is inside [`catch_panic`] (see [`catching_panic`]).
    static CATCHING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`, turning a panic inside it into an error `"{what}: {panic message}"`. For calls
/// into dependencies that panic on malformed input instead of returning an error (the
/// `tokenizers` crate does, for some broken `tokenizer.json` files).
pub fn catch_panic<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let before = CATCHING.with(|c| c.replace(true));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    CATCHING.with(|c| c.set(before));
    r.unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .map(|s| s.as_str())
            .or_else(|| p.downcast_ref::<&str>().copied())
            .unwrap_or("unknown panic");
        Err(Error::msg(format!(
            "{what}: {}",
            msg.lines().next().unwrap_or("")
        )))
    })
}

/// True while a [`catch_panic`] on this thread will turn a panic into an error: a panic hook
/// should stay quiet then.
pub fn catching_panic() -> bool {
    CATCHING.with(|c| c.get())
}
