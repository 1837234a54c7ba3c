//! Offers arbitrary bytes as one datagram to F12 routers (`tern_proto::router::fuzz`): no panic,
//! a Feedback Rate is never raised, and only its four bytes ever change.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tern_proto::router::fuzz(data, tern_proto_fuzz::epoch());
});
