//! Polling instead of sleeping: the one `wait_until` of the test suites (server, agent and
//! jail tests), and its blocking form, on the same schedule, for tests without a runtime.

use std::time::{Duration, Instant};

/// How often a condition is tried again.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Poll `f` every 20 ms until it returns `Some` or `timeout` passes; `None` means it never
/// did (the caller says what that means: usually `expect("what did not happen")`).
pub async fn wait_until<T>(timeout: Duration, mut f: impl AsyncFnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// [`wait_until`] for a test without an async runtime: the same schedule, the thread sleeps
/// between tries (so `f` may itself wait, e.g. nest another `wait_until_blocking`).
pub fn wait_until_blocking<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    #[tokio::test]
    async fn returns_the_first_value_and_stops_polling() {
        let mut calls = 0;
        let got = wait_until(Duration::from_secs(5), async || {
            calls += 1;
            (calls == 3).then_some(calls * 10)
        })
        .await;
        assert_eq!(got, Some(30));
        assert_eq!(calls, 3);
    }

    #[tokio::test]
    async fn gives_up_with_none_after_the_timeout_having_tried_more_than_once() {
        let mut calls = 0;
        let got: Option<()> = wait_until(Duration::from_millis(100), async || {
            calls += 1;
            None
        })
        .await;
        assert_eq!(got, None);
        assert!(calls >= 2, "tried {calls} times");
    }

    #[test]
    fn the_blocking_form_polls_the_same_way() {
        let calls = Cell::new(0);
        let got = wait_until_blocking(Duration::from_secs(5), || {
            calls.set(calls.get() + 1);
            (calls.get() == 2).then_some("done")
        });
        assert_eq!(got, Some("done"));
        assert_eq!(calls.get(), 2);
        let never: Option<()> = wait_until_blocking(Duration::from_millis(50), || None);
        assert_eq!(never, None);
        // Nested, as a poll of a value that is itself polled for.
        let nested = wait_until_blocking(Duration::from_secs(5), || {
            wait_until_blocking(Duration::from_secs(1), || Some(7)).filter(|n| *n == 7)
        });
        assert_eq!(nested, Some(7));
    }
}
