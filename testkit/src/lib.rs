//! Waiting in tests: poll for the exact state an assertion needs, under a deadline
//! generous enough for a busy two-core machine, and never sleep for correctness.
//!
//! A test that waits for one condition and then asserts on something that becomes true
//! later (an action's result after the action, a diagnosis after its incident, a scrape
//! after a metric, an exit status after a process) races the code under test. Every wait
//! in the suite goes through [`wait_for`] (or [`poll`] where the caller reports the
//! failure itself), asking for the state the assertion reads.
//!
//! Deadlines are multiplied by `WARDEN_TEST_PATIENCE` (a positive number, default 1), so
//! a slower machine can be given more time without touching a test.

pub mod pipe;
pub mod ports;
pub mod proxy;
pub mod tools;

use std::time::{Duration, Instant};

/// How long a test waits for something that normally takes a second or two: long enough
/// for a loaded two-core machine, short enough that a real failure still ends the run.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// How often [`poll`] and [`wait_for`] look again.
pub const POLL_EVERY: Duration = Duration::from_millis(100);

/// The environment variable that scales every deadline (a positive number; 1 when unset
/// or unreadable).
pub const PATIENCE_ENV: &str = "WARDEN_TEST_PATIENCE";

/// `limit`, scaled by [`PATIENCE_ENV`].
pub fn scaled(limit: Duration) -> Duration {
    let factor = std::env::var(PATIENCE_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|f| f.is_finite() && *f > 0.0 && *f <= 1000.0)
        .unwrap_or(1.0);
    limit.mul_f64(factor)
}

/// Call `f` every [`POLL_EVERY`] until it gives a value or the (scaled) `limit` passes.
/// `f` is always called at least once, and once more at the deadline.
pub fn poll<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + scaled(limit);
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        std::thread::sleep(POLL_EVERY.min(deadline - now));
    }
}

/// [`poll`] for up to `limit`, panicking with `what` when the value never comes.
#[track_caller]
pub fn wait_for<T>(what: &str, limit: Duration, f: impl FnMut() -> Option<T>) -> T {
    match poll(limit, f) {
        Some(v) => v,
        None => panic!("timed out after {:?} waiting for {what}", scaled(limit)),
    }
}

/// [`wait_for`] a condition with no value.
#[track_caller]
pub fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    wait_for(what, limit, || f().then_some(()))
}

/// The async form of [`poll`], for tests on a tokio runtime: `f` is awaited each round
/// and the pause between rounds does not block the runtime's thread.
pub async fn poll_async<T, F, Fut>(limit: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + scaled(limit);
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        pause(POLL_EVERY.min(deadline - now)).await;
    }
}

/// [`poll_async`], panicking with `what` when the value never comes.
pub async fn wait_for_async<T, F, Fut>(what: &str, limit: Duration, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    match poll_async(limit, f).await {
        Some(v) => v,
        None => panic!("timed out after {:?} waiting for {what}", scaled(limit)),
    }
}

/// Sleep without blocking an async runtime's thread: a helper thread wakes the task.
/// (The crate stays free of any runtime; a tokio test may equally use its own sleep.)
async fn pause(d: Duration) {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Poll, Waker};

    struct Pause {
        done: Arc<Mutex<(bool, Option<Waker>)>>,
    }
    impl Future for Pause {
        type Output = ();
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            let mut s = match self.done.lock() {
                Ok(s) => s,
                Err(p) => p.into_inner(),
            };
            if s.0 {
                Poll::Ready(())
            } else {
                s.1 = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
    let done = Arc::new(Mutex::new((false, None::<Waker>)));
    let d2 = Arc::clone(&done);
    std::thread::spawn(move || {
        std::thread::sleep(d);
        let mut s = match d2.lock() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        };
        s.0 = true;
        if let Some(w) = s.1.take() {
            w.wake();
        }
    });
    Pause { done }.await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn a_wait_returns_the_first_value_the_condition_gives() {
        let n = Cell::new(0);
        let got = wait_for("the third call", Duration::from_secs(5), || {
            n.set(n.get() + 1);
            (n.get() >= 3).then_some(n.get())
        });
        assert_eq!(got, 3);
    }

    #[test]
    fn a_condition_that_never_holds_gives_none_after_the_deadline() {
        let t = Instant::now();
        let calls = Cell::new(0);
        let got: Option<()> = poll(Duration::from_millis(300), || {
            calls.set(calls.get() + 1);
            None
        });
        assert!(got.is_none());
        assert!(t.elapsed() >= Duration::from_millis(300));
        assert!(
            calls.get() >= 2,
            "asked at least at the start and the deadline"
        );
    }

    #[test]
    #[should_panic(expected = "timed out after")]
    fn a_wait_that_runs_out_names_what_it_waited_for() {
        wait_until("nothing", Duration::from_millis(50), || false);
    }

    #[test]
    fn the_async_wait_polls_until_the_value_comes() {
        let n = Cell::new(0);
        let fut = poll_async(Duration::from_secs(5), || {
            n.set(n.get() + 1);
            let v = (n.get() >= 2).then_some(n.get());
            async move { v }
        });
        assert_eq!(block_on(fut), Some(2));
    }

    /// A minimal executor: the crate has no runtime of its own.
    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        use std::sync::Arc;
        use std::task::{Context, Poll, Wake};
        struct Unpark(std::thread::Thread);
        impl Wake for Unpark {
            fn wake(self: Arc<Self>) {
                self.0.unpark();
            }
        }
        let waker = Arc::new(Unpark(std::thread::current())).into();
        let mut cx = Context::from_waker(&waker);
        let mut f = std::pin::pin!(f);
        loop {
            match f.as_mut().poll(&mut cx) {
                Poll::Ready(v) => return v,
                Poll::Pending => std::thread::park(),
            }
        }
    }
}
