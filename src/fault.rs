//! Fault injection for the fault tests (`tests/faults.rs`): `SPARSA_FAULT_<NAME>=<n>` in the
//! environment turns on a fault that cannot be produced on demand otherwise. Unset (always, in
//! normal use) nothing changes. Each variable is read once per process.
//!
//! | variable | effect |
//! |---|---|
//! | `SPARSA_FAULT_SLOW_LOAD_MS` | sleep n ms after each uploaded tensor (to hit Ctrl-C during a load) |
//! | `SPARSA_FAULT_SLOW_QUANTIZE_MS` | sleep n ms after each tensor `sparsa quantize` writes (to hit Ctrl-C during it) |
//! | `SPARSA_FAULT_DEVICE_LOST_AFTER` | destroy the GPU device after n queue submissions (a device loss) |
//! | `SPARSA_FAULT_GPU_MEMORY` | pretend the adapter has n bytes of memory (an out-of-memory GPU) |

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// The value of `SPARSA_FAULT_{name}` as an integer, if set (read once, then remembered).
pub fn injected(name: &'static str) -> Option<u64> {
    static SEEN: OnceLock<Mutex<HashMap<&'static str, Option<u64>>>> = OnceLock::new();
    let seen = SEEN.get_or_init(Mutex::default);
    let mut m = match seen.lock() {
        Ok(m) => m,
        Err(p) => p.into_inner(),
    };
    *m.entry(name).or_insert_with(|| {
        #[cfg(target_arch = "wasm32")]
        return None;
        #[cfg(not(target_arch = "wasm32"))]
        std::env::var(format!("SPARSA_FAULT_{name}"))
            .ok()
            .and_then(|v| v.trim().parse().ok())
    })
}
