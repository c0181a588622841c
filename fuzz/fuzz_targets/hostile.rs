//! libFuzzer's entry for the `hostile` target; the body is `warden_fuzz::hostile::run`.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| warden_fuzz::hostile::run(input));
