//! Decodes arbitrary bytes with the frames decoder; whatever decodes must re-encode to the
//! same value (`tern_proto::wire::fuzz::frames`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tern_proto::wire::fuzz::frames(data);
});
