//! The oneshot channel the readbacks wait on: a buffer mapping's callback sends its result,
//! and [`Gpu::read_mapped_async`](super::Gpu::read_mapped_async) awaits the receiver.

use super::lock;
use std::sync::{Arc, Mutex};

/// A one-value channel whose receiver is a future (`None` when the sender was dropped
/// unsent): how a `map_async` callback hands its result to an `async fn`.
pub(super) fn oneshot<T>() -> (OneshotTx<T>, OneshotRx<T>) {
    let slot = Arc::new(Mutex::new(Slot {
        value: None,
        closed: false,
        waker: None,
    }));
    (OneshotTx(slot.clone()), OneshotRx(slot))
}

struct Slot<T> {
    value: Option<T>,
    closed: bool,
    waker: Option<std::task::Waker>,
}

pub(super) struct OneshotTx<T>(Arc<Mutex<Slot<T>>>);
pub(super) struct OneshotRx<T>(Arc<Mutex<Slot<T>>>);

impl<T> OneshotTx<T> {
    pub(super) fn send(self, v: T) {
        lock(&self.0).value = Some(v);
        // Drop wakes the receiver.
    }
}

impl<T> Drop for OneshotTx<T> {
    fn drop(&mut self) {
        let waker = {
            let mut s = lock(&self.0);
            s.closed = true;
            s.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<T> OneshotRx<T> {
    /// Whether the value was sent (or the sender dropped): awaiting it would not wait.
    #[cfg(not(target_arch = "wasm32"))]
    pub(super) fn is_ready(&self) -> bool {
        let s = lock(&self.0);
        s.value.is_some() || s.closed
    }
}

impl<T> std::future::Future for OneshotRx<T> {
    type Output = Option<T>;
    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<T>> {
        let mut s = lock(&self.0);
        if let Some(v) = s.value.take() {
            return std::task::Poll::Ready(Some(v));
        }
        if s.closed {
            return std::task::Poll::Ready(None);
        }
        s.waker = Some(cx.waker().clone());
        std::task::Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oneshot_delivers_a_value_or_none_when_the_sender_is_dropped() {
        let (tx, rx) = oneshot();
        tx.send(7u32);
        assert_eq!(pollster::block_on(rx), Some(7));
        let (tx, rx) = oneshot::<u32>();
        let waiter = std::thread::spawn(move || pollster::block_on(rx));
        drop(tx);
        assert_eq!(waiter.join().unwrap(), None);
    }
}
