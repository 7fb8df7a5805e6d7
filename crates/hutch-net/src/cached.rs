//! A value read from the host at most once per period: callers within the period share the
//! last reading, and a caller after it reads again while the others wait for that reading.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The last reading of a `T` and when it was taken.
pub(crate) struct Cached<T> {
    max_age: Duration,
    last: Mutex<Option<(Instant, Arc<T>)>>,
}

impl<T> Cached<T> {
    /// Nothing read yet; readings are kept for `max_age`.
    pub(crate) fn new(max_age: Duration) -> Self {
        Self {
            max_age,
            last: Mutex::new(None),
        }
    }

    /// The last reading if younger than the period, else a new one from `read` (a failed
    /// reading is not kept).
    pub(crate) fn get<E>(&self, read: impl FnOnce() -> Result<T, E>) -> Result<Arc<T>, E> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, value)) = last.as_ref() {
            if at.elapsed() < self.max_age {
                return Ok(value.clone());
            }
        }
        let fresh = Arc::new(read()?);
        *last = Some((Instant::now(), fresh.clone()));
        Ok(fresh)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    #[test]
    fn one_reading_serves_every_caller_of_its_period() {
        let cached = Cached::new(Duration::from_millis(50));
        let reads = Cell::new(0);
        let read = || {
            reads.set(reads.get() + 1);
            Ok::<_, ()>(reads.get())
        };
        assert_eq!(*cached.get(read).expect("read"), 1);
        assert_eq!(*cached.get(read).expect("cached"), 1);
        assert_eq!(reads.get(), 1);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(*cached.get(read).expect("read again"), 2);
        // A failure is not kept: the next caller reads.
        let cached = Cached::<u32>::new(Duration::from_secs(60));
        assert!(cached.get(|| Err("nft failed")).is_err());
        assert_eq!(*cached.get(|| Ok::<_, &str>(7)).expect("read"), 7);
    }
}
