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
