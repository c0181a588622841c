//! libFuzzer's entry for the `cri` target; the body is `warden_fuzz::cri::run`.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| warden_fuzz::cri::run(input));
