//! libFuzzer's entry for the `rules` target; the body is `warden_fuzz::rules::run`.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| warden_fuzz::rules::run(input));
