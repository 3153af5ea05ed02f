//! Redis/Valkey adapters: the lease lock (Lua compare-then-act scripts, all keys of a script under one
//! hash tag) and the hot cache. One reconnecting connection per process (`ConnectionManager`, or a
//! cluster connection for ElastiCache Serverless), made at the first command ([`RedisConn`]) so a
//! process starts while Redis is down and reads no secret at start-up; `rediss://` for TLS, verified against the system roots or a named CA; an ACL user and
//! password when the server requires them ([`RedisAuth`]); the settings from the environment are
//! [`env`]'s. Scripts run by `EVALSHA` and
//! fall back to `EVAL` on `NOSCRIPT`, so they survive a Redis restart or failover. Every key carries
//! the configured prefix.

pub mod env;
pub mod events;

use crate::ports::{Acquire, Cache, CacheError, Charge, LeaseLock, LockError, ShareAsk, ShareState, Verdict};
use async_trait::async_trait;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Script, Value};
use std::time::Duration;

pub mod limiter;
mod share;

/// Errors connecting to Redis at start-up.
#[derive(Debug, thiserror::Error)]
pub enum RedisSetupError {
    /// The URL is malformed.
    #[error("invalid REDIS_URL: {0}")]
    Url(String),
    /// The certificate authority for `rediss://` is not usable.
    #[error("invalid LANES_REDIS_CA_FILE: {0}")]
    Ca(String),
}

/// Connection settings.
#[derive(Debug, Clone)]
pub struct RedisSettings {
    /// `redis://` or `rediss://` URL.
    pub url: String,
    /// Cluster mode (ElastiCache Serverless, cluster-mode-enabled replication groups).
    pub cluster: bool,
    /// Prefix of every key, e.g. `lanes:`.
    pub prefix: String,
    /// Bound on connecting and on each response, so an outage degrades quickly instead of stalling.
    pub timeout: Duration,
    /// The certificate authority (PEM) a `rediss://` server's certificate must chain to, instead of
    /// the system roots: a self-hosted Valkey, a test CA.
    pub ca_pem: Option<Vec<u8>>,
    /// An ACL user and its password (`AUTH user password` on every connection), when the server
    /// requires one.
    pub auth: Option<RedisAuth>,
}

/// An ACL user of the cache (an ElastiCache user, a `redis-server` ACL user).
#[derive(Debug, Clone)]
pub struct RedisAuth {
    /// The user name.
    pub user: String,
    /// Its password, read when the first command connects (never at start-up).
    pub password: crate::secret::Secret,
}

/// A cloneable connection, made on first use, not at start-up ([`connect`]).
///
/// Why not at start-up: a cluster client must reach a node to learn the slot map, and the ACL
/// user's password is read from Secrets Manager; a process that insisted on either at start would
/// fail every cold start while the cache or Secrets Manager is down (although Redis only
/// accelerates), and would put a network round trip into every init. So the first command makes the
/// connection. Until one is made every command fails fast (callers count a degraded operation): a
/// new attempt is made at most once per [`RECONNECT_EVERY`], by whichever command comes first, while
/// the others wait for it at most one command's timeout instead of queueing behind it. A password that cannot be read fails the
/// attempt like an unreachable server, and the next attempt reads it again. Once made, a single
/// node's connection manager and the cluster connection each reconnect by themselves.
#[derive(Clone)]
pub struct RedisConn(std::sync::Arc<Lazy>);

struct Lazy {
    settings: RedisSettings,
    conn: tokio::sync::OnceCell<Connected>,
    last_attempt: tokio::sync::Mutex<Option<tokio::time::Instant>>,
}

/// A made connection: one endpoint (reconnecting in the background) or a cluster.
#[derive(Clone)]
enum Connected {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// Least time between two attempts to reach a cache that was unreachable.
pub const RECONNECT_EVERY: Duration = Duration::from_secs(1);

fn unreachable(detail: &str) -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::Io, "Redis unreachable", detail.to_owned()))
}

/// The connection info of `settings`: its URL, with its user and password when it names one.
async fn connection_info(settings: &RedisSettings) -> redis::RedisResult<redis::ConnectionInfo> {
    use redis::IntoConnectionInfo;
    let info = settings.url.as_str().into_connection_info()?;
    let Some(auth) = &settings.auth else { return Ok(info) };
    let password = auth.password.current().await.map_err(|e| {
        tracing::error!(error = %e, user = %auth.user, "cache password not read; running without the cache");
        unreachable("the cache password could not be read")
    })?;
    let redis = info.redis_settings().clone().set_username(&auth.user).set_password(&*password);
    Ok(info.set_redis_settings(redis))
}

impl Lazy {
    async fn conn(&self) -> redis::RedisResult<Connected> {
        if let Some(c) = self.conn.get() {
            return Ok(c.clone());
        }
        let Ok(mut last) = self.last_attempt.try_lock() else {
            // Another command is connecting (the first commands of a cold start come together):
            // wait for it, at most as long as one command may take, rather than queue behind a
            // cache that does not answer.
            let _ = tokio::time::timeout(self.settings.timeout, self.last_attempt.lock()).await;
            return self.conn.get().cloned().ok_or_else(|| unreachable("another command is connecting"));
        };
        let now = tokio::time::Instant::now();
        if last.is_some_and(|at| now < at + RECONNECT_EVERY) {
            return Err(unreachable("retrying in the background"));
        }
        *last = Some(now);
        let made = self.make().await?;
        Ok(self.conn.get_or_init(|| async { made }).await.clone())
    }

    async fn make(&self) -> redis::RedisResult<Connected> {
        let s = &self.settings;
        let certs = |ca: &Vec<u8>| redis::TlsCertificates { client_tls: None, root_cert: Some(ca.clone()) };
        let info = connection_info(s).await?;
        if s.cluster {
            let mut builder = redis::cluster::ClusterClientBuilder::new(vec![info])
                .connection_timeout(s.timeout)
                .response_timeout(s.timeout);
            if let Some(ca) = &s.ca_pem {
                builder = builder.certs(certs(ca));
            }
            return Ok(Connected::Cluster(builder.build()?.get_async_connection().await?));
        }
        let client = match &s.ca_pem {
            Some(ca) => redis::Client::build_with_tls(info, certs(ca))?,
            None => redis::Client::open(info)?,
        };
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(s.timeout))
            .set_response_timeout(Some(s.timeout))
            .set_number_of_retries(1);
        // Lazy itself: made without reaching the server, it connects at its first command.
        Ok(Connected::Single(ConnectionManager::new_lazy_with_config(client, config)?))
    }
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            match self.0.conn().await? {
                Connected::Single(mut c) => c.req_packed_command(cmd).await,
                Connected::Cluster(mut c) => c.req_packed_command(cmd).await,
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            match self.0.conn().await? {
                Connected::Single(mut c) => c.req_packed_commands(pipeline, offset, count).await,
                Connected::Cluster(mut c) => c.req_packed_commands(pipeline, offset, count).await,
            }
        })
    }

    fn get_db(&self) -> i64 {
        match self.0.conn.get() {
            Some(Connected::Single(c)) => c.get_db(),
            _ => 0,
        }
    }
}

/// The process's one connection, made at its first command. Nothing here reaches the network: the
/// URL and a CA are checked now, so a wrong one stops the start; the server and the password are
/// reached and read at first use.
pub async fn connect(settings: &RedisSettings) -> Result<RedisConn, RedisSetupError> {
    use redis::IntoConnectionInfo;
    let info =
        settings.url.as_str().into_connection_info().map_err(|e| RedisSetupError::Url(e.to_string()))?;
    if let Some(ca) = &settings.ca_pem {
        let certs = redis::TlsCertificates { client_tls: None, root_cert: Some(ca.clone()) };
        redis::Client::build_with_tls(info, certs).map_err(|e| RedisSetupError::Ca(e.to_string()))?;
    }
    Ok(RedisConn(std::sync::Arc::new(Lazy {
        settings: settings.clone(),
        conn: tokio::sync::OnceCell::new(),
        last_attempt: tokio::sync::Mutex::new(None),
    })))
}

/// Extends the lease only if the caller's token still holds it (compare-then-`PEXPIRE`).
const RENEW: &str = include_str!("renew.lua");

/// Releases the lease only if the caller's token still holds it (compare-then-`DEL`).
const RELEASE: &str = include_str!("release.lua");

/// Takes the lock or reports the holder's remaining TTL, atomically.
const ACQUIRE: &str = include_str!("acquire.lua");

/// The lease lock in Redis.
#[derive(Clone)]
pub struct RedisLock {
    conn: RedisConn,
    prefix: String,
    acquire: Script,
    renew: Script,
    release: Script,
}

impl RedisLock {
    /// A lock over `conn` with keys under `prefix`.
    pub fn new(conn: RedisConn, prefix: &str) -> Self {
        Self {
            conn,
            prefix: prefix.to_owned(),
            acquire: Script::new(ACQUIRE),
            renew: Script::new(RENEW),
            release: Script::new(RELEASE),
        }
    }

    /// The stored key. Callers put the hash tag in `key` (`lease:{task:<id>}`) so a script's keys share
    /// a slot in cluster mode.
    fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }
}

fn lock_err(e: redis::RedisError) -> LockError {
    LockError::Unavailable(e.to_string())
}

fn ms(d: Duration) -> u64 {
    d.as_millis().max(1) as u64
}

#[async_trait]
impl LeaseLock for RedisLock {
    async fn acquire(&self, key: &str, ttl: Duration) -> Result<Acquire, LockError> {
        crate::metrics::aws_request("redis", "EVALSHA acquire");
        let token = uuid::Uuid::new_v4().to_string();
        let mut conn = self.conn.clone();
        let pttl: i64 = self
            .acquire
            .key(self.key(key))
            .arg(&token)
            .arg(ms(ttl))
            .invoke_async(&mut conn)
            .await
            .map_err(lock_err)?;
        Ok(match pttl {
            -1 => Acquire::Acquired(token),
            // -2: expired between SET and PTTL; report a minimal wait rather than looping here.
            n => Acquire::Held { remaining: Duration::from_millis(n.max(1) as u64) },
        })
    }

    async fn renew(&self, key: &str, token: &str, ttl: Duration) -> Result<bool, LockError> {
        crate::metrics::aws_request("redis", "EVALSHA renew");
        let mut conn = self.conn.clone();
        let n: i64 = self
            .renew
            .key(self.key(key))
            .arg(token)
            .arg(ms(ttl))
            .invoke_async(&mut conn)
            .await
            .map_err(lock_err)?;
        Ok(n == 1)
    }

    async fn release(&self, key: &str, token: &str) -> Result<bool, LockError> {
        crate::metrics::aws_request("redis", "EVALSHA release");
        let mut conn = self.conn.clone();
        let n: i64 =
            self.release.key(self.key(key)).arg(token).invoke_async(&mut conn).await.map_err(lock_err)?;
        Ok(n == 1)
    }
}

/// The hot cache in Redis.
#[derive(Clone)]
pub struct RedisCache {
    conn: RedisConn,
    prefix: String,
}

impl RedisCache {
    /// A cache over `conn` with keys under `prefix`.
    pub fn new(conn: RedisConn, prefix: &str) -> Self {
        Self { conn, prefix: prefix.to_owned() }
    }
}

#[async_trait]
impl Cache for RedisCache {
    async fn get(&self, key: &str) -> Result<Option<String>, CacheError> {
        crate::metrics::aws_request("redis", "GET");
        let mut conn = self.conn.clone();
        redis::cmd("GET")
            .arg(format!("{}{key}", self.prefix))
            .query_async(&mut conn)
            .await
            .map_err(|e| CacheError::Unavailable(e.to_string()))
    }

    async fn set(&self, key: &str, value: &str, ttl: Duration) -> Result<(), CacheError> {
        crate::metrics::aws_request("redis", "SET");
        let mut conn = self.conn.clone();
        redis::cmd("SET")
            .arg(format!("{}{key}", self.prefix))
            .arg(value)
            .arg("PX")
            .arg(ms(ttl))
            .query_async::<()>(&mut conn)
            .await
            .map_err(|e| CacheError::Unavailable(e.to_string()))
    }

    async fn add(&self, key: &str, by: u64, ttl: Duration) -> Result<u64, CacheError> {
        crate::metrics::aws_request("redis", "EVALSHA add");
        // INCRBY and the first expiry in one step, so a counter can never be left without a TTL.
        static ADD: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
            redis::Script::new(
                "local v = redis.call('INCRBY', KEYS[1], ARGV[1]) \
                 if redis.call('PTTL', KEYS[1]) < 0 then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end \
                 return v",
            )
        });
        let mut conn = self.conn.clone();
        ADD.key(format!("{}{key}", self.prefix))
            .arg(by)
            .arg(ms(ttl))
            .invoke_async(&mut conn)
            .await
            .map_err(|e| CacheError::Unavailable(e.to_string()))
    }

    async fn leave(&self, key: &str, member: &str) -> Result<(), CacheError> {
        crate::metrics::aws_request("redis", "ZREM");
        let mut conn = self.conn.clone();
        redis::cmd("ZREM")
            .arg(format!("{}{key}", self.prefix))
            .arg(member)
            .query_async::<()>(&mut conn)
            .await
            .map_err(|e| CacheError::Unavailable(e.to_string()))
    }

    async fn enter_within(
        &self,
        key: &str,
        member: &str,
        now_ms: u64,
        until_ms: u64,
        max: u64,
    ) -> Result<bool, CacheError> {
        crate::metrics::aws_request("redis", "EVALSHA enter_within");
        // One sorted set per key, scored by each member's end time. Dropping the ended, counting and
        // adding in one script keeps the set from growing with crashed members and lets two workers
        // racing for the last place not both take it; the key's own expiry (a day past this
        // member's end, relative so the server's clock never mixes with the caller's) removes a set
        // nobody enters any more. A script, not MULTI, because it runs the same on a cluster (one
        // key, one slot). Without a cap (`enter`) the count never refuses.
        static ENTER_WITHIN: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
            redis::Script::new(
                "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1]) \
                 if not redis.call('ZSCORE', KEYS[1], ARGV[3]) \
                    and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[5]) then return 0 end \
                 redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3]) \
                 redis.call('PEXPIRE', KEYS[1], ARGV[4]) \
                 return 1",
            )
        });
        let mut conn = self.conn.clone();
        ENTER_WITHIN
            .key(format!("{}{key}", self.prefix))
            .arg(now_ms)
            .arg(until_ms)
            .arg(member)
            .arg(until_ms.saturating_sub(now_ms).saturating_add(86_400_000))
            .arg(max)
            .invoke_async::<i64>(&mut conn)
            .await
            .map(|n| n == 1)
            .map_err(|e| CacheError::Unavailable(e.to_string()))
    }

    async fn count_live(&self, key: &str, now_ms: u64) -> Result<u64, CacheError> {
        crate::metrics::aws_request("redis", "ZCOUNT");
        let mut conn = self.conn.clone();
        redis::cmd("ZCOUNT")
            .arg(format!("{}{key}", self.prefix))
            .arg(format!("({now_ms}"))
            .arg("+inf")
            .query_async(&mut conn)
            .await
            .map_err(|e| CacheError::Unavailable(e.to_string()))
    }

    async fn reserve(&self, charges: &[Charge]) -> Result<Option<usize>, CacheError> {
        if charges.is_empty() {
            return Ok(None);
        }
        crate::metrics::aws_request("redis", "EVALSHA reserve");
        // The check and the charges in one script: concurrent reservations never both see room.
        static RESERVE: std::sync::LazyLock<redis::Script> =
            std::sync::LazyLock::new(|| redis::Script::new(include_str!("reserve.lua")));
        let mut invocation = RESERVE.prepare_invoke();
        for c in charges {
            invocation
                .key(format!("{}{}", self.prefix, c.key))
                .arg(c.amount)
                .arg(c.limit.map_or(-1, |l| l.min(i64::MAX as u64) as i64))
                .arg(ms(c.ttl).max(1));
        }
        let refused: usize = invocation
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| CacheError::Unavailable(e.to_string()))?;
        Ok(refused.checked_sub(1))
    }

    async fn share(&self, key: &str, ask: &ShareAsk) -> Result<Verdict, CacheError> {
        use crate::domain::token_share::Step;
        crate::metrics::aws_request("redis", "EVALSHA share");
        // One script per step, so two workers deciding at once each see the other's charge. A
        // decision reads the lane's waiting groups; a submission or a correction its group's field
        // alone. The three keys share the lane's hash tag, so a cluster keeps them in one slot.
        static SHARE: std::sync::LazyLock<redis::Script> =
            std::sync::LazyLock::new(|| redis::Script::new(include_str!("share.lua")));
        let (kind, amount) = match ask.step {
            Step::Submit => ("submit", 0),
            Step::Decide { estimate } => ("decide", estimate.min(i64::MAX as u64) as i64),
            Step::Settle { delta } => ("settle", delta),
        };
        let s = &ask.settings;
        let lane = format!("{}{key}", self.prefix);
        let go: i64 = SHARE
            .key(&lane)
            .key(format!("{lane}:waiting"))
            .key(format!("{lane}:swept"))
            .arg(&ask.group)
            .arg(ask.weight)
            .arg(kind)
            .arg(amount)
            .arg(ask.now_ms)
            .arg(s.window_ms.max(1))
            .arg(s.forget_ms)
            .arg(crate::domain::token_share::state_ttl_ms(s))
            .arg(s.patience_ms)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| CacheError::Unavailable(e.to_string()))?;
        Ok(if go == 1 { Verdict::Go } else { Verdict::PutOff })
    }

    async fn share_state(&self, key: &str) -> Result<ShareState, CacheError> {
        crate::metrics::aws_request("redis", "HGETALL share");
        let fields: Vec<(String, Vec<u8>)> = redis::cmd("HGETALL")
            .arg(format!("{}{key}", self.prefix))
            .query_async(&mut self.conn.clone())
            .await
            .map_err(|e| CacheError::Unavailable(e.to_string()))?;
        // Entries that do not decode are left out, as the script leaves them out.
        Ok(fields.into_iter().filter_map(|(g, u)| Some((g, share::stored_use(&u)?))).collect())
    }
}
