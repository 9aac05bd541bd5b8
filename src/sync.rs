//! The synchronization primitives the session harness shares between host threads and its
//! checker thread: std's, or [loom]'s under `--cfg loom`, so that `tests/loom_recorder.rs` can
//! explore the interleavings of the real session code.
//!
//! Loom has a `Mutex`, a `Condvar` and threads, but its `mpsc` channel does not model
//! disconnection (a receive after every sender is gone blocks forever), which is how the checker
//! thread learns that the session is finished. Under loom, [`mpsc`] is therefore a small channel
//! of its own, built from loom's `Mutex` and `Condvar`, with std's semantics: a receive returns
//! an error once the queue is empty and every sender is gone, a send fails once the receiver is
//! gone.
//!
//! [loom]: https://docs.rs/loom

#[cfg(not(loom))]
pub(crate) use std::sync::{mpsc, Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::thread;

#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(loom)]
pub(crate) use loom::thread;

/// `std::sync::mpsc` with std's disconnection semantics, on loom's primitives.
#[cfg(loom)]
pub(crate) mod mpsc {
    use std::collections::VecDeque;
    use std::sync::{Arc, PoisonError};

    use loom::sync::{Condvar, Mutex, MutexGuard};

    pub(crate) use std::sync::mpsc::{RecvError, SendError, TryRecvError};

    struct State<T> {
        queue: VecDeque<T>,
        senders: usize,
        receiver: bool,
    }

    struct Chan<T> {
        state: Mutex<State<T>>,
        ready: Condvar,
    }

    impl<T> Chan<T> {
        fn lock(&self) -> MutexGuard<'_, State<T>> {
            self.state.lock().unwrap_or_else(PoisonError::into_inner)
        }
    }

    /// The sending half.
    pub(crate) struct Sender<T>(Arc<Chan<T>>);

    /// The receiving half.
    pub(crate) struct Receiver<T>(Arc<Chan<T>>);

    /// An unbounded channel.
    pub(crate) fn channel<T>() -> (Sender<T>, Receiver<T>) {
        let chan = Arc::new(Chan {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                senders: 1,
                receiver: true,
            }),
            ready: Condvar::new(),
        });
        (Sender(chan.clone()), Receiver(chan))
    }

    /// A bounded channel. The session sends exactly one reply on each one it makes, so a send
    /// never waits for room and the bound is not modelled.
    pub(crate) fn sync_channel<T>(_bound: usize) -> (Sender<T>, Receiver<T>) {
        channel()
    }

    impl<T> Sender<T> {
        pub(crate) fn send(&self, value: T) -> Result<(), SendError<T>> {
            let mut st = self.0.lock();
            if !st.receiver {
                return Err(SendError(value));
            }
            st.queue.push_back(value);
            drop(st);
            self.0.ready.notify_one();
            Ok(())
        }
    }

    impl<T> Clone for Sender<T> {
        fn clone(&self) -> Self {
            self.0.lock().senders += 1;
            Sender(self.0.clone())
        }
    }

    impl<T> Drop for Sender<T> {
        fn drop(&mut self) {
            let mut st = self.0.lock();
            st.senders -= 1;
            let last = st.senders == 0;
            drop(st);
            if last {
                self.0.ready.notify_all();
            }
        }
    }

    impl<T> Receiver<T> {
        pub(crate) fn recv(&self) -> Result<T, RecvError> {
            let mut st = self.0.lock();
            loop {
                if let Some(value) = st.queue.pop_front() {
                    return Ok(value);
                }
                if st.senders == 0 {
                    return Err(RecvError);
                }
                st = self
                    .0
                    .ready
                    .wait(st)
                    .unwrap_or_else(PoisonError::into_inner);
            }
        }

        pub(crate) fn try_recv(&self) -> Result<T, TryRecvError> {
            let mut st = self.0.lock();
            match st.queue.pop_front() {
                Some(value) => Ok(value),
                None if st.senders == 0 => Err(TryRecvError::Disconnected),
                None => Err(TryRecvError::Empty),
            }
        }
    }

    impl<T> Drop for Receiver<T> {
        fn drop(&mut self) {
            let mut st = self.0.lock();
            st.receiver = false;
            let queued = std::mem::take(&mut st.queue);
            drop(st);
            // Messages still queued are dropped with the receiver, outside the lock.
            drop(queued);
        }
    }

    /// The messages of a receiver until every sender is gone.
    pub(crate) struct IntoIter<T>(Receiver<T>);

    impl<T> Iterator for IntoIter<T> {
        type Item = T;

        fn next(&mut self) -> Option<T> {
            self.0.recv().ok()
        }
    }

    impl<T> IntoIterator for Receiver<T> {
        type Item = T;
        type IntoIter = IntoIter<T>;

        fn into_iter(self) -> IntoIter<T> {
            IntoIter(self)
        }
    }
}
