//! A secret read when it is first needed, kept, and read again when it may have been rotated
//! ([`Secret`]): the webhook's GitHub secret and GitLab token, the commits worker's API tokens and
//! the LLM API keys.
//!
//! Why not once at cold start: that read is a network round trip inside every init, and a value
//! read once is kept for the container's life, hours after an operator rotated it, while every
//! delivery signed with the new value is refused. Here:
//! - a secret is read at its first use or, where the process starts ahead of its first event
//!   (`adapters::secrets::reads_ahead`), in the background from the start ([`Secret::read_ahead`]);
//!   a use before that read is done waits for it rather than starting a second one;
//! - a value older than [`MAX_AGE`] is read again at its next use; if that read fails the old value
//!   serves (Secrets Manager being down does not refuse every delivery) and the read is tried
//!   again after [`MIN_REREAD`];
//! - a check that fails with the value (a signature that does not match, a token refused with 401)
//!   reads it again and tries once more ([`Secret::check`]), at most once per [`MIN_REREAD`], so
//!   forged deliveries cannot become a stream of Secrets Manager requests;
//! - a failed first read is answered to every use for [`FAILED_READ_BACKOFF`], then tried again:
//!   an unreadable secret costs one request per interval, not one per delivery;
//! - a read made while a value exists is bounded by [`REFRESH_TIMEOUT`], well inside a webhook's
//!   10 s, so a Secrets Manager that hangs delays a delivery by that much, not past its deadline.
//!
//! A first read that fails (an empty value is a failed read) is logged as an error: a wrong id or a
//! missing permission shows up as that log and as each use's error, not as a failed cold start.
//!
//! Reads are single-flight: one lock per secret is held across its read, so concurrent uses wait
//! for one request. The reading itself is a [`Fetch`] (Secrets Manager in `adapters::secrets`).

use crate::clock::SharedClock;
use crate::config::ConfigError;
use futures::future::BoxFuture;
use std::sync::Arc;
use std::time::Duration;

/// How long a read value serves before the next use reads it again.
pub const MAX_AGE: Duration = Duration::from_secs(15 * 60);
/// The least time between two reads that a failed check or a failed refresh asks for.
pub const MIN_REREAD: Duration = Duration::from_secs(30);
/// How long a failed read with no value to fall back on is answered without reading again.
pub const FAILED_READ_BACKOFF: Duration = Duration::from_secs(5);
/// The longest a refresh or re-read may take while an older value could serve instead.
pub const REFRESH_TIMEOUT: Duration = Duration::from_secs(2);

/// Reads the secret's current value.
pub type Fetch = Arc<dyn Fn() -> BoxFuture<'static, Result<String, ConfigError>> + Send + Sync>;

/// A secret value: given as such (a variable), or read through a [`Fetch`].
#[derive(Clone)]
pub struct Secret(Source);

#[derive(Clone)]
enum Source {
    Fixed(Arc<str>),
    Read(Arc<Reader>),
}

struct Reader {
    fetch: Fetch,
    clock: SharedClock,
    state: Arc<tokio::sync::Mutex<State>>,
}

#[derive(Default)]
struct State {
    held: Held,
    /// When a failed check last asked for a read.
    reread_at_ms: Option<u64>,
}

/// What a read secret holds, and until when it is answered without reading.
#[derive(Default)]
enum Held {
    #[default]
    Unread,
    /// The last read failed with nothing to fall back on.
    Failed { error: ConfigError, until_ms: u64 },
    /// A value: for MAX_AGE after a read, for MIN_REREAD more after a failed refresh.
    Value { value: Arc<str>, until_ms: u64 },
}

impl State {
    fn value(&self) -> Option<&Arc<str>> {
        match &self.held {
            Held::Value { value, .. } => Some(value),
            _ => None,
        }
    }

    /// Keeps `value`, read at `now_ms`, for MAX_AGE.
    fn keep(&mut self, value: String, now_ms: u64) -> Arc<str> {
        let value: Arc<str> = value.into();
        self.held = Held::Value { value: value.clone(), until_ms: now_ms + MAX_AGE.as_millis() as u64 };
        value
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            Source::Fixed(_) => "Secret(<given>)",
            Source::Read(_) => "Secret(<read>)",
        })
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self::fixed(value)
    }
}

impl Secret {
    /// A value given as such; never read again.
    pub fn fixed(value: impl Into<String>) -> Self {
        Self(Source::Fixed(value.into().into()))
    }

    /// A value read by `fetch` when first needed (see the module docs for when again).
    pub fn read_by(fetch: Fetch, clock: SharedClock) -> Self {
        Self(Source::Read(Arc::new(Reader { fetch, clock, state: Default::default() })))
    }

    /// Starts reading in the background, for a process whose init runs ahead of its first event:
    /// the first use finds the value, or waits for this read (reads are single-flight, so a use that
    /// comes first reads and this one then finds the value). A given value, or a process without a
    /// tokio runtime, is left alone.
    pub fn read_ahead(&self) {
        let (Source::Read(_), Ok(runtime)) = (&self.0, tokio::runtime::Handle::try_current()) else { return };
        let secret = self.clone();
        runtime.spawn(async move {
            let _ = secret.current().await;
        });
    }

    /// The current value, read if it never was or is older than [`MAX_AGE`].
    pub async fn current(&self) -> Result<Arc<str>, ConfigError> {
        match &self.0 {
            Source::Fixed(v) => Ok(v.clone()),
            Source::Read(r) => r.current().await,
        }
    }

    /// Whether `accepts` holds for the current value; when it does not, the value is read again
    /// (unless a read was asked in the last [`MIN_REREAD`]) and, if it changed, `accepts` is asked
    /// once more. Errors only when there is no value at all.
    pub async fn check(&self, accepts: impl Fn(&str) -> bool) -> Result<bool, ConfigError> {
        let value = self.current().await?;
        if accepts(&value) {
            return Ok(true);
        }
        Ok(self.reread(&value).await.is_some_and(|new| accepts(&new)))
    }

    /// Whether this secret is read (and so may be rotated) rather than given.
    pub fn is_read(&self) -> bool {
        matches!(self.0, Source::Read(_))
    }

    /// A new value, if `refused` (the value a check just failed with) was rotated: read again unless
    /// a read was asked in the last [`MIN_REREAD`]. `None` for a given value.
    pub async fn reread(&self, refused: &str) -> Option<Arc<str>> {
        match &self.0 {
            Source::Fixed(_) => None,
            Source::Read(r) => r.reread(refused).await,
        }
    }
}

impl Reader {
    async fn current(&self) -> Result<Arc<str>, ConfigError> {
        let mut state = self.state.lock().await;
        let now = self.clock.now_ms();
        match &state.held {
            Held::Value { value, until_ms } if now < *until_ms => return Ok(value.clone()),
            Held::Failed { error, until_ms } if now < *until_ms => return Err(error.clone()),
            _ => {}
        }
        let old = state.value().cloned();
        match self.read(old.is_some()).await {
            Ok(v) => Ok(state.keep(v, now)),
            Err(e) => match old {
                Some(old) => {
                    tracing::warn!(error = %e, "secret refresh failed; the value read before serves on");
                    let until_ms = now + MIN_REREAD.as_millis() as u64;
                    state.held = Held::Value { value: old.clone(), until_ms };
                    Ok(old)
                }
                None => {
                    if matches!(state.held, Held::Unread) {
                        tracing::error!(error = %e, "secret not read; each use tries again");
                    }
                    let until_ms = now + FAILED_READ_BACKOFF.as_millis() as u64;
                    state.held = Held::Failed { error: e.clone(), until_ms };
                    Err(e)
                }
            },
        }
    }

    /// One read; bounded by [`REFRESH_TIMEOUT`] when `fallback` (an older value can serve).
    async fn read(&self, fallback: bool) -> Result<String, ConfigError> {
        if !fallback {
            return (self.fetch)().await;
        }
        tokio::time::timeout(REFRESH_TIMEOUT, (self.fetch)()).await.unwrap_or_else(|_| {
            Err(ConfigError::Invalid {
                name: "secret",
                reason: format!("no answer within {REFRESH_TIMEOUT:?}"),
            })
        })
    }

    /// A new value, if reading again finds one that differs from `seen`.
    async fn reread(&self, seen: &str) -> Option<Arc<str>> {
        let mut state = self.state.lock().await;
        // Another use may have read a new value while this one waited for the lock.
        if let Some(v) = state.value().filter(|v| &***v != seen) {
            return Some(v.clone());
        }
        let now = self.clock.now_ms();
        if state.reread_at_ms.is_some_and(|t| now.saturating_sub(t) < MIN_REREAD.as_millis() as u64) {
            return None;
        }
        state.reread_at_ms = Some(now);
        match self.read(true).await {
            Ok(v) => {
                let rotated = v != seen;
                let v = state.keep(v, now);
                rotated.then_some(v)
            }
            Err(e) => {
                tracing::warn!(error = %e, "secret re-read failed");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A store whose value the test sets, counting reads; `None` makes reads fail.
    struct Store {
        value: Mutex<Option<String>>,
        reads: AtomicUsize,
    }

    fn store(value: &str) -> Arc<Store> {
        Arc::new(Store { value: Mutex::new(Some(value.into())), reads: AtomicUsize::new(0) })
    }

    fn set(store: &Store, value: Option<&str>) {
        *store.value.lock().unwrap_or_else(|e| e.into_inner()) = value.map(str::to_owned);
    }

    fn secret(store: &Arc<Store>, clock: &Arc<ManualClock>) -> Secret {
        let store = store.clone();
        let fetch: Fetch =
            Arc::new(move || {
                let store = store.clone();
                Box::pin(async move {
                    store.reads.fetch_add(1, Ordering::SeqCst);
                    store.value.lock().unwrap_or_else(|e| e.into_inner()).clone().ok_or(
                        ConfigError::Invalid { name: "LANES_TEST_SECRET", reason: "unavailable".into() },
                    )
                })
            });
        Secret::read_by(fetch, clock.clone())
    }

    fn reads(store: &Store) -> usize {
        store.reads.load(Ordering::SeqCst)
    }

    #[tokio::test]
    async fn read_once_when_first_used_then_again_once_old() {
        let (clock, store) = (ManualClock::new(0), store("v1"));
        let s = secret(&store, &clock);
        assert_eq!(reads(&store), 0, "nothing is read before a use");
        assert_eq!(&*s.current().await.ok().unwrap_or_default(), "v1");
        assert_eq!(&*s.current().await.ok().unwrap_or_default(), "v1");
        assert_eq!(reads(&store), 1);
        set(&store, Some("v2"));
        clock.advance_ms(MAX_AGE.as_millis() as u64);
        assert_eq!(&*s.current().await.ok().unwrap_or_default(), "v2");
        assert_eq!(reads(&store), 2);
    }

    #[tokio::test]
    async fn a_failed_refresh_keeps_the_old_value_and_retries_later() {
        let (clock, store) = (ManualClock::new(0), store("v1"));
        let s = secret(&store, &clock);
        s.current().await.ok();
        set(&store, None);
        clock.advance_ms(MAX_AGE.as_millis() as u64);
        assert_eq!(&*s.current().await.ok().unwrap_or_default(), "v1", "the old value serves on");
        assert_eq!(&*s.current().await.ok().unwrap_or_default(), "v1");
        assert_eq!(reads(&store), 2, "no read on every use while the store is down");
        set(&store, Some("v2"));
        clock.advance_ms(MIN_REREAD.as_millis() as u64);
        assert_eq!(&*s.current().await.ok().unwrap_or_default(), "v2");
    }

    #[tokio::test]
    async fn a_failed_first_read_is_an_error_answered_for_a_backoff_then_retried() {
        let (clock, store) = (ManualClock::new(0), store("v1"));
        set(&store, None);
        let s = secret(&store, &clock);
        let err = s.current().await.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("LANES_TEST_SECRET"), "{err}");
        set(&store, Some("v1"));
        for _ in 0..10 {
            assert!(s.current().await.is_err(), "the failure is answered for the backoff");
        }
        assert_eq!(reads(&store), 1, "no read per use while the secret is unreadable");
        clock.advance_ms(FAILED_READ_BACKOFF.as_millis() as u64);
        assert_eq!(&*s.current().await.ok().unwrap_or_default(), "v1");
        assert_eq!(reads(&store), 2);
    }

    #[tokio::test]
    async fn a_failed_check_reads_a_rotated_value_at_most_once_per_interval() {
        let (clock, store) = (ManualClock::new(0), store("old"));
        let s = secret(&store, &clock);
        assert!(s.check(|v| v == "old").await.unwrap_or(false));
        set(&store, Some("new"));
        assert!(s.check(|v| v == "new").await.unwrap_or(false), "rotation picked up at the first mismatch");
        assert_eq!(reads(&store), 2);
        // Forged values: no read within MIN_REREAD of the last, then one per interval.
        for _ in 0..10 {
            assert!(!s.check(|v| v == "forged").await.unwrap_or(true));
        }
        assert_eq!(reads(&store), 2);
        clock.advance_ms(MIN_REREAD.as_millis() as u64);
        for _ in 0..10 {
            assert!(!s.check(|v| v == "forged").await.unwrap_or(true));
        }
        assert_eq!(reads(&store), 3);
        assert!(s.check(|v| v == "new").await.unwrap_or(false), "the value is unchanged by the failures");
    }

    #[tokio::test]
    async fn a_read_ahead_reads_once_before_any_use_and_serves_it() {
        let (clock, store) = (ManualClock::new(0), store("v1"));
        let (s, given) = (secret(&store, &clock), Secret::fixed("g"));
        s.read_ahead();
        given.read_ahead();
        for _ in 0..100 {
            if reads(&store) > 0 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(reads(&store), 1, "read with no use asking");
        assert_eq!(s.current().await.ok().as_deref(), Some("v1"));
        assert_eq!(given.current().await.ok().as_deref(), Some("g"));
        assert_eq!(reads(&store), 1, "the first use finds it");
    }

    #[tokio::test]
    async fn a_use_before_the_read_ahead_runs_makes_the_only_read() {
        let (clock, store) = (ManualClock::new(0), store("v1"));
        let s = secret(&store, &clock);
        s.read_ahead();
        assert_eq!(s.current().await.ok().as_deref(), Some("v1"));
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(reads(&store), 1, "the read ahead finds the value and reads nothing");
    }

    /// A refresh that never answers is cut at REFRESH_TIMEOUT (2 s of this test) and the old value
    /// serves: without the cut this test would never end.
    #[tokio::test]
    async fn a_hanging_refresh_is_cut_short_and_the_old_value_serves() {
        let clock = ManualClock::new(0);
        let calls = Arc::new(AtomicUsize::new(0));
        let fetch: Fetch = {
            let calls = calls.clone();
            Arc::new(move || {
                let first = calls.fetch_add(1, Ordering::SeqCst) == 0;
                Box::pin(async move {
                    if !first {
                        std::future::pending::<()>().await;
                    }
                    Ok("v1".to_owned())
                })
            })
        };
        let s = Secret::read_by(fetch, clock.clone());
        assert_eq!(s.current().await.ok().as_deref(), Some("v1"));
        clock.advance_ms(MAX_AGE.as_millis() as u64);
        assert_eq!(s.current().await.ok().as_deref(), Some("v1"));
        assert_eq!(calls.load(Ordering::SeqCst), 2, "the refresh was tried");
    }

    #[tokio::test]
    async fn a_given_value_is_never_read() {
        let s = Secret::fixed("plain");
        assert!(s.check(|v| v == "plain").await.unwrap_or(false));
        assert!(!s.check(|v| v == "other").await.unwrap_or(true));
        assert_eq!(format!("{s:?}"), "Secret(<given>)");
    }
}
