//! Placeholder: the config module is being written.
