//! Placeholder: the metrics module is being written.
