//! libFuzzer's entry for the `wire` target; the body is `warden_fuzz::wire::run`.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| warden_fuzz::wire::run(input));
