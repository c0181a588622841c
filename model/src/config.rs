//! How a binary reports configuration mistakes: each names where the value came from
//! and the field, and all of them are reported together.

use std::fmt;

/// One configuration mistake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Where the value came from: a file path, an environment variable or a flag.
    pub origin: String,
    /// The field concerned (`listen`, `max_batch_bytes`, ...), or empty when the whole
    /// source is unusable (an unreadable file).
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}: {}", self.origin, self.message)
        } else {
            write!(
                f,
                "{}: field `{}`: {}",
                self.origin, self.field, self.message
            )
        }
    }
}

/// Every mistake found in a configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.len();
        write!(
            f,
            "{n} configuration error{}",
            if n == 1 { "" } else { "s" }
        )?;
        for e in &self.0 {
            write!(f, "\n  - {e}")?;
        }
        Ok(())
    }
}
