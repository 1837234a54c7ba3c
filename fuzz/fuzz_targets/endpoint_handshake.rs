//! A real client and server complete an IK handshake, then the input scripts what happens
//! next: raw datagrams injected at either end, application writes/finishes/resets/stops,
//! loss, duplication, corruption, reordering and rebinding of the real datagrams, time
//! passing and closes. Checked: no panic, every byte read is the byte written, and no
//! connection ends with a protocol error. Input format: see `tern_proto_fuzz::script`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tern_proto_fuzz::script::run(data);
});
