//! libFuzzer's entry for the `api` target; the body is `warden_fuzz::api::run`.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| warden_fuzz::api::run(input));
