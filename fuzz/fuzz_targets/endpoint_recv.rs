//! A server endpoint fed arbitrary datagrams from one client address: it must never panic,
//! and never send that address more than 3x what it received (plus a small allowance).
//! Input format: see `tern_proto_fuzz::recv`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tern_proto_fuzz::recv::run(data);
});
