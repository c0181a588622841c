//! libFuzzer's entry for the `watchdog` target; the body is `warden_fuzz::watchdog::run`.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| warden_fuzz::watchdog::run(input));
