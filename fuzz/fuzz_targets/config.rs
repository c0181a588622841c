//! libFuzzer's entry for the `config` target; the body is `warden_fuzz::config::run`.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| warden_fuzz::config::run(input));
