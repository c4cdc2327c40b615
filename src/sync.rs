//! Locks that outlive a panic: one way to take a `Mutex`, `RwLock` or `Condvar` whose last
//! holder panicked.
//!
//! Every lock in this crate guards data that is whole between statements (queues, counters,
//! handles, caches the engine can rebuild from disk), never a half-made change. So a thread that
//! panicked while holding one leaves nothing to repair, and the next holder goes on with the data
//! as it is: one panicking worker must not take the daemon's other threads down with it.

use std::sync::{
    Condvar, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard,
    WaitTimeoutResult,
};
use std::time::Duration;

/// `Mutex::lock`, recovering the guard from a poisoned lock.
pub trait MutexExt<T> {
    fn lock_or_recover(&self) -> MutexGuard<'_, T>;
}

impl<T> MutexExt<T> for Mutex<T> {
    fn lock_or_recover(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// `RwLock::read` and `write`, recovering the guard from a poisoned lock.
pub trait RwLockExt<T> {
    fn read_or_recover(&self) -> RwLockReadGuard<'_, T>;
    fn write_or_recover(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T> RwLockExt<T> for RwLock<T> {
    fn read_or_recover(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_or_recover(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// `Condvar::wait` and `wait_timeout`, recovering the guard from a poisoned lock.
pub trait CondvarExt {
    fn wait_or_recover<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T>;
    fn wait_timeout_or_recover<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        timeout: Duration,
    ) -> (MutexGuard<'a, T>, WaitTimeoutResult);
}

impl CondvarExt for Condvar {
    fn wait_or_recover<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        self.wait(guard).unwrap_or_else(PoisonError::into_inner)
    }

    fn wait_timeout_or_recover<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        timeout: Duration,
    ) -> (MutexGuard<'a, T>, WaitTimeoutResult) {
        self.wait_timeout(guard, timeout)
            .unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn a_lock_whose_holder_panicked_is_taken_with_its_data_as_left() {
        let m = Arc::new(Mutex::new(vec![1]));
        let held = Arc::clone(&m);
        let _ = std::thread::spawn(move || {
            let mut v = held.lock().unwrap();
            v.push(2);
            panic!("the holder panics with the lock held");
        })
        .join();
        assert!(m.is_poisoned());
        assert_eq!(*m.lock_or_recover(), [1, 2]);

        let rw = Arc::new(RwLock::new(7));
        let held = Arc::clone(&rw);
        let _ = std::thread::spawn(move || {
            let _g = held.write().unwrap();
            panic!("the writer panics with the lock held");
        })
        .join();
        assert!(rw.is_poisoned());
        *rw.write_or_recover() += 1;
        assert_eq!(*rw.read_or_recover(), 8);
    }
}
