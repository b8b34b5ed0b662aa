//! A first-in-first-out async lock: `runTask` calls on one model run one at a time, in call order.
//! wasm is single-threaded, so the state is a `RefCell`; a waiter parks on a oneshot channel and the
//! guard's drop hands the lock straight to the next waiter (it never becomes free in between, so no
//! later caller can overtake a queued one). Nothing here is held across an `await` except the guard.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

use futures_channel::oneshot;

#[derive(Default)]
pub struct FifoLock {
    state: RefCell<State>,
}

#[derive(Default)]
struct State {
    locked: bool,
    waiters: VecDeque<oneshot::Sender<()>>,
}

/// Holds the lock until dropped (also when the holder's future fails or is dropped).
pub struct Guard {
    lock: Rc<FifoLock>,
}

impl FifoLock {
    /// Wait for the lock; callers are served in the order they called.
    pub async fn acquire(self: &Rc<Self>) -> Guard {
        let rx = {
            let mut st = self.state.borrow_mut();
            if !st.locked {
                st.locked = true;
                return Guard { lock: self.clone() };
            }
            let (tx, rx) = oneshot::channel();
            st.waiters.push_back(tx);
            rx
        };
        // The previous holder's drop sent us the lock (a cancelled channel cannot happen: senders are
        // only dropped after a successful send or together with the lock, which we keep alive).
        let _ = rx.await;
        Guard { lock: self.clone() }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let mut st = self.lock.state.borrow_mut();
        while let Some(tx) = st.waiters.pop_front() {
            if tx.send(()).is_ok() {
                return; // handed over: stays locked
            }
        }
        st.locked = false;
    }
}
