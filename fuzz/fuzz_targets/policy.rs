//! libFuzzer's entry for the `policy` target; the body is `warden_fuzz::policy::run`.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| warden_fuzz::policy::run(input));
