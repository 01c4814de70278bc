//! PostgreSQL for the tests: each test gets a schema of its own (`idem_<what>_<random>`) in the
//! database of `DATABASE_URL`, and connections whose `search_path` is that schema, so tests run in
//! parallel against one server. Without `DATABASE_URL` at build time the PostgreSQL tests are
//! ignored (see `build.rs`); one that runs anyway without it fails with [`MISSING`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use idempotency::store::PostgresStore;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{Connection, PgConnection};

/// Why a PostgreSQL test that was not ignored cannot run.
pub const MISSING: &str =
    "DATABASE_URL is not set: this PostgreSQL test runs only with a database \
     (it is ignored when the tests are built without DATABASE_URL)";

/// `DATABASE_URL`, if set (and not empty).
pub fn database_url() -> Option<String> {
    std::env::var("DATABASE_URL")
        .ok()
        .filter(|u| !u.trim().is_empty())
}

/// `DATABASE_URL`; a PostgreSQL test that runs without it fails (it is never reported as passed).
pub fn database_url_or_skip() -> Option<String> {
    match database_url() {
        Some(url) => Some(url),
        None => panic!("{MISSING}"),
    }
}

/// A name no other test picks: `idem_<what>_<pid><time><counter>` in lowercase hex.
pub fn unique_name(what: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!(
        "idem_{what}_{:x}{:x}{n:x}",
        std::process::id(),
        nanos & 0xffff_ffff_ffff
    )
}

/// A schema of one test. Dropped (with everything in it) by [`TestSchema::drop_schema`], or when
/// the value is dropped (say, by a failing assertion) if it owns the schema.
#[derive(Debug)]
pub struct TestSchema {
    url: String,
    name: String,
    owned: bool,
}

impl TestSchema {
    /// Creates a fresh schema (fails without `DATABASE_URL`: see [`MISSING`]).
    ///
    /// # Panics
    /// If the database cannot be reached (a test failure, not a skip).
    pub async fn create(what: &str) -> Option<TestSchema> {
        let url = database_url_or_skip()?;
        let name = unique_name(what);
        let mut conn = PgConnection::connect(&url)
            .await
            .expect("connect to DATABASE_URL");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE SCHEMA \"{name}\"")))
            .execute(&mut conn)
            .await
            .expect("create the test schema");
        conn.close().await.ok();
        Some(TestSchema {
            url,
            name,
            owned: true,
        })
    }

    /// An existing schema (a worker process's view of its parent's); never dropped by this value.
    pub fn attach(url: &str, name: &str) -> TestSchema {
        TestSchema {
            url: url.to_owned(),
            name: name.to_owned(),
            owned: false,
        }
    }

    /// The schema's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The database URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Connection options for the schema (`search_path` set), not tuned.
    ///
    /// # Panics
    /// If `DATABASE_URL` does not parse.
    pub fn options(&self) -> PgConnectOptions {
        let options: PgConnectOptions = self.url.parse().expect("DATABASE_URL parses");
        options.options([("search_path", self.name.as_str())])
    }

    /// A pool of `size` connections to the schema, tuned for the store ([`PostgresStore::tune`]).
    ///
    /// # Panics
    /// If the database cannot be reached.
    pub async fn pool(&self, size: u32) -> PgPool {
        PgPoolOptions::new()
            .max_connections(size)
            .connect_with(PostgresStore::tune(self.options()))
            .await
            .expect("connect the pool")
    }

    /// A store in the schema (a tuned pool of 10), migrated, that takes the engine's times as
    /// given (`trusting_engine_clock`): for tests that move time with a `ManualClock`.
    ///
    /// # Panics
    /// If the database cannot be reached or the migrations fail.
    pub async fn store(&self) -> PostgresStore {
        self.server_clock_store().await.trusting_engine_clock()
    }

    /// A store in the schema as users get it: every time decided by the database server's clock.
    ///
    /// # Panics
    /// If the database cannot be reached or the migrations fail.
    pub async fn server_clock_store(&self) -> PostgresStore {
        PostgresStore::from_pool(self.pool(10).await)
            .await
            .expect("open the PostgreSQL store")
    }

    /// Drops the schema and everything in it.
    pub async fn drop_schema(mut self) {
        if self.owned {
            self.owned = false;
            drop_schema(&self.url, &self.name).await;
        }
    }
}

async fn drop_schema(url: &str, name: &str) {
    if let Ok(mut conn) = PgConnection::connect(url).await {
        let sql = format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE");
        if let Err(e) = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await
        {
            eprintln!("could not drop test schema {name}: {e}");
        }
        conn.close().await.ok();
    }
}

impl Drop for TestSchema {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // Still owned: the test ended early. Clean up from a thread of its own, as this may run
        // inside (or outside) a Tokio runtime.
        let (url, name) = (self.url.clone(), self.name.clone());
        let cleanup = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                rt.block_on(drop_schema(&url, &name));
            }
        });
        cleanup.join().ok();
    }
}
