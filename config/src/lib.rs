//! Layered configuration of Warden's binaries: defaults, then a YAML file, then `WARDEN_*`
//! environment variables, then flags; the last layer that gives a setting decides it.
//! Every mistake in every layer is collected and reported together
//! ([`ConfigErrors`]), each naming its field and where the value came from, and the
//! origin of every setting a layer gave is kept ([`Provenance`]).
//!
//! The controller, the agent and the `warden` CLI all load through [`Loader`]; each
//! keeps only its own settings, bounds and defaults.
//!
//! The three binaries also share two things at their edges: the log format, which
//! escapes every field so one event is one line ([`logfmt`]), and writing to stdout,
//! where a reader that goes away ends the process quietly ([`stdout`]). Data files a
//! person writes (a policy, a fleet) are read whole within a bound ([`file`]).

pub mod file;
mod loader;
pub mod logfmt;
pub mod stdout;

pub use loader::{Loaded, Loader, Provenance, annotated_yaml, whole};
pub use warden_model::config::{ConfigError, ConfigErrors};
