//! UDT (libudt, C++ shim) and SRT (libsrt, C shim) as [`Transport`]s. Both shims have the
//! same C ABI (`shim/udt_shim.cpp`, `shim/srt_shim.c`); this file declares it once per
//! library with a macro. Built only when the Debian headers are present (see build.rs).
#![allow(unsafe_code)] // FFI into libudt/libsrt; every call passes valid, live buffers.

#[allow(unused_macros)] // unused when neither library is installed
macro_rules! shim {
    ($modname:ident, $ty:ident, $startup:ident, $listen:ident, $accept:ident, $connect:ident,
     $send:ident, $recv:ident, $rcvtimeo:ident, $close:ident, $error:ident, $label:literal) => {
        mod $modname {
            use std::ffi::{CStr, CString};
            use std::io;
            use std::net::{IpAddr, SocketAddr};
            use std::os::raw::{c_char, c_int};
            use std::sync::atomic::{AtomicBool, Ordering};
            use std::time::Duration;

            use crate::proto::stream::{Conn, Listener, Transport};

            extern "C" {
                fn $startup() -> c_int;
                fn $listen(ip: *const c_char, port: c_int, bound: *mut c_int) -> c_int;
                fn $accept(ls: c_int) -> c_int;
                fn $connect(ip: *const c_char, port: c_int, bind: *const c_char) -> c_int;
                fn $send(s: c_int, buf: *const c_char, len: c_int) -> c_int;
                fn $recv(s: c_int, buf: *mut c_char, len: c_int) -> c_int;
                fn $rcvtimeo(s: c_int, ms: c_int) -> c_int;
                fn $close(s: c_int) -> c_int;
                fn $error() -> *const c_char;
            }

            fn last_error() -> io::Error {
                // SAFETY: the library returns a pointer to a NUL-terminated message that
                // lives at least until the next call on this thread.
                let msg = unsafe {
                    let p = $error();
                    if p.is_null() {
                        String::from("unknown error")
                    } else {
                        CStr::from_ptr(p).to_string_lossy().into_owned()
                    }
                };
                io::Error::other(format!("{}: {msg}", $label))
            }

            fn cstr(ip: IpAddr) -> CString {
                CString::new(ip.to_string()).expect("an address has no NUL")
            }

            /// The transport.
            #[derive(Debug, Default)]
            pub struct $ty;

            impl $ty {
                /// Initialises the library (idempotent).
                pub fn new() -> Self {
                    // SAFETY: no arguments; startup is reference counted by the library.
                    unsafe { $startup() };
                    Self
                }
            }

            struct SConn {
                s: c_int,
                closed: AtomicBool,
            }

            impl Conn for SConn {
                fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
                    let len = buf.len().min(i32::MAX as usize) as c_int;
                    // SAFETY: buf is valid for len bytes.
                    let n = unsafe { $recv(self.s, buf.as_mut_ptr().cast(), len) };
                    match n {
                        -2 => Err(io::ErrorKind::WouldBlock.into()),
                        n if n < 0 => {
                            if self.closed.load(Ordering::Relaxed) {
                                Ok(0)
                            } else {
                                // A broken connection is how both libraries report the
                                // peer's close.
                                let e = last_error();
                                if e.to_string().contains("onnection") {
                                    Ok(0)
                                } else {
                                    Err(e)
                                }
                            }
                        }
                        n => Ok(n as usize),
                    }
                }
                fn send(&self, buf: &[u8]) -> io::Result<usize> {
                    let len = buf.len().min(1 << 20) as c_int;
                    // SAFETY: buf is valid for len bytes.
                    let n = unsafe { $send(self.s, buf.as_ptr().cast(), len) };
                    if n < 0 {
                        Err(last_error())
                    } else {
                        Ok(n as usize)
                    }
                }
                fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
                    let ms = t.map_or(-1, |d| d.as_millis().clamp(1, i32::MAX as u128) as c_int);
                    // SAFETY: plain integer arguments.
                    if unsafe { $rcvtimeo(self.s, ms) } < 0 {
                        return Err(last_error());
                    }
                    Ok(())
                }
                fn shutdown(&self) {
                    if !self.closed.swap(true, Ordering::Relaxed) {
                        // SAFETY: closing a handle we own, once.
                        unsafe { $close(self.s) };
                    }
                }
            }

            impl Drop for SConn {
                fn drop(&mut self) {
                    self.shutdown();
                }
            }

            struct SListener {
                s: c_int,
                addr: SocketAddr,
            }

            impl Listener for SListener {
                fn accept(&self) -> io::Result<Box<dyn Conn>> {
                    // SAFETY: plain integer argument.
                    let s = unsafe { $accept(self.s) };
                    if s < 0 {
                        return Err(last_error());
                    }
                    Ok(Box::new(SConn {
                        s,
                        closed: AtomicBool::new(false),
                    }))
                }
                fn local_addr(&self) -> io::Result<SocketAddr> {
                    Ok(self.addr)
                }
            }

            impl Transport for $ty {
                fn listen(&self, addr: SocketAddr) -> io::Result<Box<dyn Listener>> {
                    let ip = cstr(addr.ip());
                    let mut port: c_int = 0;
                    // SAFETY: ip is NUL-terminated; port is a valid out-pointer.
                    let s = unsafe { $listen(ip.as_ptr(), c_int::from(addr.port()), &mut port) };
                    if s < 0 {
                        return Err(last_error());
                    }
                    Ok(Box::new(SListener {
                        s,
                        addr: SocketAddr::new(addr.ip(), port as u16),
                    }))
                }

                fn connect(
                    &self,
                    addr: SocketAddr,
                    bind: Option<IpAddr>,
                ) -> io::Result<Box<dyn Conn>> {
                    let ip = cstr(addr.ip());
                    let b = bind.map(cstr);
                    let bp = b.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
                    // SAFETY: both strings are NUL-terminated or null.
                    let s = unsafe { $connect(ip.as_ptr(), c_int::from(addr.port()), bp) };
                    if s < 0 {
                        return Err(last_error());
                    }
                    Ok(Box::new(SConn {
                        s,
                        closed: AtomicBool::new(false),
                    }))
                }
            }
        }
        pub use $modname::$ty;
    };
}

#[cfg(tern_bench_udt)]
shim!(
    udt,
    Udt,
    tb_udt_startup,
    tb_udt_listen,
    tb_udt_accept,
    tb_udt_connect,
    tb_udt_send,
    tb_udt_recv,
    tb_udt_set_rcvtimeo,
    tb_udt_close,
    tb_udt_error,
    "udt"
);

#[cfg(tern_bench_srt)]
shim!(
    srt,
    Srt,
    tb_srt_startup,
    tb_srt_listen,
    tb_srt_accept,
    tb_srt_connect,
    tb_srt_send,
    tb_srt_recv,
    tb_srt_set_rcvtimeo,
    tb_srt_close,
    tb_srt_error,
    "srt"
);
