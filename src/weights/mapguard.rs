//! What happens when a mapped model file shrinks under sparsa.
//!
//! Weights are memory-mapped, not read. If another program truncates a file while it is
//! mapped (a download restarting, `cp` over it, a full disk), touching a page past the new end
//! raises SIGBUS, which would kill the process with no word of why. Each mapping is
//! registered here, and [`install`] (the CLI calls it first thing) adds a SIGBUS handler that,
//! for a fault inside a registered mapping, prints one line naming the file and exits with
//! status 1. Faults anywhere else keep the default action.
//!
//! Pages are touched while the weights are uploaded: at load, and during generation for the
//! routed experts that stream under `--gpu-memory` (see `crate::experts`; their mappings stay
//! registered as long as the model lives). Contents that change without the size shrinking
//! cannot fault; [`super::WeightFiles::check_unchanged`] compares each file's size and
//! modification time after the upload (and, when experts stream, after every forward chunk
//! that read expert bytes) and refuses a model whose files changed meanwhile.

use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// Registered mappings at most (a model has a few hundred shards at most; more are simply
/// not guarded).
const SLOTS: usize = 4096;

struct Slot {
    /// Start address of the mapping; 0 when the slot is free.
    start: AtomicUsize,
    len: AtomicUsize,
    /// The file's path (leaked, so the handler can read it at any time) and its length.
    path: AtomicPtr<u8>,
    path_len: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Slot = Slot {
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    path: AtomicPtr::new(std::ptr::null_mut()),
    path_len: AtomicUsize::new(0),
};
static TABLE: [Slot; SLOTS] = [FREE; SLOTS];

/// Register the mapping `[start, start + len)` of `path`; returns its slot for [`unregister`].
pub fn register(start: *const u8, len: usize, path: &std::path::Path) -> Option<usize> {
    if len == 0 {
        return None;
    }
    // Leaked on purpose: a few bytes per opened file, readable by the handler forever.
    let name: &'static mut [u8] =
        Box::leak(path.display().to_string().into_bytes().into_boxed_slice());
    for (i, s) in TABLE.iter().enumerate() {
        if s.start
            .compare_exchange(0, usize::MAX, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            s.len.store(len, Ordering::SeqCst);
            s.path_len.store(name.len(), Ordering::SeqCst);
            s.path.store(name.as_mut_ptr(), Ordering::SeqCst);
            s.start.store(start as usize, Ordering::SeqCst);
            return Some(i);
        }
    }
    None
}

/// Forget a mapping before it is unmapped.
pub fn unregister(slot: usize) {
    if let Some(s) = TABLE.get(slot) {
        s.start.store(0, Ordering::SeqCst);
    }
}

/// The registered file containing `addr`: (path bytes, offset in the file).
fn lookup(addr: usize) -> Option<(&'static [u8], usize)> {
    for s in &TABLE {
        let start = s.start.load(Ordering::SeqCst);
        if start == 0 || start == usize::MAX {
            continue;
        }
        let len = s.len.load(Ordering::SeqCst);
        if addr >= start && addr - start < len {
            let p = s.path.load(Ordering::SeqCst);
            let n = s.path_len.load(Ordering::SeqCst);
            if p.is_null() {
                return None;
            }
            // SAFETY: `p` points at `n` bytes leaked by `register`, never freed or written.
            let path = unsafe { std::slice::from_raw_parts(p as *const u8, n) };
            return Some((path, addr - start));
        }
    }
    None
}

/// Install the SIGBUS handler (once; later calls do nothing).
#[cfg(unix)]
pub fn install() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: `sigaction` is given a zeroed (valid) struct with a handler of the
        // SA_SIGINFO signature; the handler only calls async-signal-safe functions (write,
        // sigaction, raise, _exit) and reads atomics and leaked, immutable bytes.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigbus as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut sa.sa_mask);
            if libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut()) != 0 {
                log::warn!("cannot install the SIGBUS handler for mapped model files");
            }
        }
    });
}

/// Not a unix: nothing to install (Windows reports an in-page error instead of SIGBUS).
#[cfg(not(unix))]
pub fn install() {}

#[cfg(unix)]
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo_t for a SA_SIGINFO handler; for SIGBUS
    // its si_addr is the faulting address.
    let addr = unsafe { (*info).si_addr() } as usize;
    if let Some((path, offset)) = lookup(addr) {
        let mut msg = [0u8; 1024];
        let mut n = 0;
        for part in [
            b"\nerror: ".as_slice(),
            path,
            b": the file shrank while sparsa was reading it (byte ".as_slice(),
            digits(offset as u64).as_slice(),
            b" is gone); was it replaced or truncated? Run again once the file is complete\n"
                .as_slice(),
        ] {
            for &b in part {
                if b != 0 && n < msg.len() - 1 {
                    msg[n] = b;
                    n += 1;
                }
            }
        }
        if msg[n - 1] != b'\n' {
            msg[n] = b'\n';
            n += 1;
        }
        // SAFETY: write and _exit are async-signal-safe; `msg` is a live stack buffer.
        unsafe {
            libc::write(2, msg.as_ptr() as *const libc::c_void, n);
            libc::_exit(1);
        }
    }
    // Not ours: the default action (terminate with a core dump), as if no handler existed.
    // SAFETY: async-signal-safe calls with a zeroed, valid sigaction.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(sig, &sa, std::ptr::null_mut());
        libc::raise(sig);
    }
}

/// Decimal digits of `v`, NUL-padded (no allocation: runs in a signal handler).
fn digits(mut v: u64) -> [u8; 20] {
    let mut tmp = [0u8; 20];
    let mut i = tmp.len();
    loop {
        i -= 1;
        tmp[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    let mut out = [0u8; 20];
    out[..tmp.len() - i].copy_from_slice(&tmp[i..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_are_decimal() {
        let s = |v| {
            let d = digits(v);
            String::from_utf8(d.iter().copied().take_while(|&b| b != 0).collect()).unwrap()
        };
        assert_eq!(s(0), "0");
        assert_eq!(s(1234567), "1234567");
        assert_eq!(s(u64::MAX), u64::MAX.to_string());
    }

    #[test]
    fn lookup_finds_registered_ranges_only() {
        let buf = [0u8; 100];
        let slot = register(
            buf.as_ptr(),
            buf.len(),
            std::path::Path::new("/m/x.safetensors"),
        )
        .unwrap();
        let base = buf.as_ptr() as usize;
        let (p, off) = lookup(base + 42).unwrap();
        assert_eq!((p, off), (b"/m/x.safetensors".as_slice(), 42));
        assert!(lookup(base + 100).is_none());
        unregister(slot);
        assert!(lookup(base + 42).is_none());
    }
}
