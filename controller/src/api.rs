//! Placeholder: the api module is being written.
