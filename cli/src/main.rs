//! The warden CLI.
fn main() {}
