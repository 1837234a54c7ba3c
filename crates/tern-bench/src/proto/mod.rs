//! One driver per protocol. Connection-oriented byte streams (kernel TCP/MPTCP, UDT, SRT)
//! share [`stream`]; multiplexing protocols (quinn, tern) share [`mux`]; the unreliable
//! baselines (UDP, RTP) are in [`udp`].

pub mod cshim;
pub mod meter;
pub mod mux;
pub mod quic;
pub mod stream;
pub mod tcp;
pub mod ternp;
pub mod tls;
pub mod udp;
pub mod video;
