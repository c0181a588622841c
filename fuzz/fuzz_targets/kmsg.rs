//! libFuzzer's entry for the `kmsg` target; the body is `warden_fuzz::kmsg::run`.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| warden_fuzz::kmsg::run(input));
