//! Ctrl-C for every command, through one handler installed before anything else runs.
//!
//! Outside the phases that poll for it, Ctrl-C prints `error: interrupted` and exits with
//! status 130 at once (parsing files, waiting for a line of piped input). While a phase polls
//! ([`Polling`]): loading weights, prefill and generation, a chat reply, an interactive prompt
//! — the first Ctrl-C only sets a flag; the phase stops at its next step, reports what was
//! interrupted and the program ends (or, in chat, returns to the prompt). A second Ctrl-C
//! before the first was handled exits at once, so a stuck step can always be left.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Whether a phase polls [`requested`] (else Ctrl-C exits at once).
static POLLING: AtomicBool = AtomicBool::new(false);
/// Ctrl-C was pressed and not yet handled.
static REQUESTED: AtomicBool = AtomicBool::new(false);
/// The flag of the GPU whose weights are being loaded (the loader checks it between tensors).
static LOADING: Mutex<Option<Arc<AtomicBool>>> = Mutex::new(None);

/// The exit status of a program ended by Ctrl-C (128 + SIGINT).
pub const EXIT_CODE: i32 = 130;

/// Install the handler. Without it (some sandboxes refuse), Ctrl-C keeps its default action.
pub fn install() {
    if let Err(e) = ctrlc::set_handler(on_ctrl_c) {
        log::warn!("cannot catch Ctrl-C: {e}");
    }
}

fn on_ctrl_c() {
    let again = REQUESTED.swap(true, Ordering::SeqCst);
    if again || !POLLING.load(Ordering::SeqCst) {
        eprintln!("\nerror: interrupted");
        std::process::exit(EXIT_CODE);
    }
    if let Some(flag) = LOADING.lock().ok().and_then(|g| g.clone()) {
        flag.store(true, Ordering::SeqCst);
    }
}

/// Ctrl-C was pressed since the last [`clear`].
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}

/// Forget a handled Ctrl-C (chat goes on after an interrupted reply).
pub fn clear() {
    REQUESTED.store(false, Ordering::SeqCst);
}

/// While alive, Ctrl-C sets a flag instead of exiting (restores the previous mode on drop).
pub struct Polling {
    before: bool,
}

impl Polling {
    pub fn start() -> Polling {
        Polling {
            before: POLLING.swap(true, Ordering::SeqCst),
        }
    }
}

impl Drop for Polling {
    fn drop(&mut self) {
        POLLING.store(self.before, Ordering::SeqCst);
    }
}

/// While alive, Ctrl-C also raises `flag` (a GPU's interrupt flag, which the weight loader
/// checks between tensors).
pub struct Loading {
    _poll: Polling,
}

impl Loading {
    pub fn start(flag: Arc<AtomicBool>) -> Loading {
        if let Ok(mut g) = LOADING.lock() {
            *g = Some(flag);
        }
        Loading {
            _poll: Polling::start(),
        }
    }
}

impl Drop for Loading {
    fn drop(&mut self) {
        if let Ok(mut g) = LOADING.lock() {
            *g = None;
        }
    }
}
