//! The clock: the one module of tern that reads it (the core takes `now` as an argument; the
//! socket is in [`crate::socket`]).

#![allow(clippy::disallowed_methods)] // The real clock belongs here and only here.

use std::time::Instant;

/// The current time.
pub(crate) fn now() -> Instant {
    Instant::now()
}
