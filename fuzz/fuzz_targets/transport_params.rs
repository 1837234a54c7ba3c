//! Decodes arbitrary bytes with the transport params decoder; whatever decodes must re-encode to the
//! same value (`tern_proto::wire::fuzz::transport_params`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tern_proto::wire::fuzz::transport_params(data);
});
