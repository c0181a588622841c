//! libFuzzer's entry for the `nccl_profiler` target; the body is `warden_fuzz::nccl_profiler::run`.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| warden_fuzz::nccl_profiler::run(input));
