//! libFuzzer's entry for the `log_metrics` target; the body is `warden_fuzz::log_metrics::run`.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| warden_fuzz::log_metrics::run(input));
