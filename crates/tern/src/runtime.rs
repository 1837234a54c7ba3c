//! The clock: the one module of tern that reads it (the core takes `now` as an argument; the
//! socket is in [`crate::socket`]).

#![allow(clippy::disallowed_methods)] // The real clock belongs here and only here.

use std::time::Instant;

/// The current time.
pub(crate) fn now() -> Instant {
    Instant::now()
}

/// The wall clock, as time since the UNIX epoch (first-flight timestamps, PROTOCOL.md §7.6);
/// `None` if the system clock is set before 1970.
pub(crate) fn wall_clock() -> Option<std::time::Duration> {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
}
