//! `#[idempotent(transactional)]`: the claim, the handler's writes and the outcome in one
//! transaction of the store's database, on PostgreSQL and on a SQLite file. Every count is taken
//! at the far side: the `orders` table the handler writes, read through another connection.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use idempotency::store::{MemoryStore, PostgresStore, SqliteStore, Store};
use idempotency::{idempotent, Call, Caller, Classify, Disposition, Error, Idempotency};
use idempotency_tests::pg::TestSchema;
use idempotency_tests::sqlite_file::SqliteFile;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Db {
    Postgres,
    Sqlite,
}

struct Ctx {
    engine: Idempotency,
    db: Db,
    /// Body starts.
    runs: AtomicUsize,
    /// When set, the body signals `inside` after its insert and waits for `go`.
    gate: Option<(Arc<Notify>, Arc<Notify>)>,
}

impl idempotency::IdempotencyContext<()> for Ctx {
    fn idempotency(&self) -> &Idempotency {
        &self.engine
    }
    fn caller(&self, _: &()) -> Result<Caller, Error> {
        Ok(Caller::new("acme", "alice"))
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Order {
    order_id: String,
    /// What the handler does after its insert.
    then: Then,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
enum Then {
    Answer,
    Decline,
    FailRetryable,
    Panic,
    /// Inserts an order of a customer that does not exist: a deferred foreign key refuses the
    /// commit.
    UnknownCustomer,
    Enqueue,
    EnqueueThenFail,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Placed {
    order_id: String,
    reference: String,
}

#[derive(Debug, thiserror::Error, Serialize, Deserialize)]
enum OrderError {
    #[error("declined")]
    Declined,
    #[error("try again")]
    Busy,
    #[error("{0}")]
    Wrapper(String),
    #[error("database: {0}")]
    Db(String),
}

impl Classify for OrderError {
    fn disposition(&self) -> Disposition {
        match self {
            OrderError::Declined => Disposition::Definitive,
            OrderError::Busy | OrderError::Db(_) => Disposition::Retryable,
            OrderError::Wrapper(_) => Disposition::Unknown,
        }
    }
}

impl From<Error> for OrderError {
    fn from(e: Error) -> Self {
        OrderError::Wrapper(e.advice())
    }
}

impl From<idempotency::TransactionError> for OrderError {
    fn from(e: idempotency::TransactionError) -> Self {
        OrderError::Db(e.to_string())
    }
}

impl From<sqlx::Error> for OrderError {
    fn from(e: sqlx::Error) -> Self {
        OrderError::Db(e.to_string())
    }
}

const INSERT: &str = "INSERT INTO orders (order_id, reference, customer) VALUES ($1, $2, $3)";

#[idempotent(window = "1h", business_key = "order_id", transactional)]
async fn place_order(ctx: &Ctx, args: Order) -> Result<Placed, OrderError> {
    ctx.runs.fetch_add(1, Ordering::SeqCst);
    let call = Call::current().ok_or(OrderError::Busy)?;
    let reference = call.reference().to_string();
    let customer = if args.then == Then::UnknownCustomer {
        "nobody"
    } else {
        "acme"
    };
    match ctx.db {
        Db::Postgres => {
            let mut tx = call.transaction::<sqlx::Postgres>()?;
            let insert = sqlx::query(INSERT).bind(&args.order_id).bind(&reference);
            insert.bind(customer).execute(&mut *tx).await?;
        }
        Db::Sqlite => {
            let mut tx = call.transaction::<sqlx::Sqlite>()?;
            let insert = sqlx::query(INSERT).bind(&args.order_id).bind(&reference);
            insert.bind(customer).execute(&mut *tx).await?;
        }
    }
    if let Some((inside, go)) = &ctx.gate {
        inside.notify_one();
        go.notified().await;
    }
    match args.then {
        Then::Answer | Then::UnknownCustomer => {}
        Then::Decline => return Err(OrderError::Declined),
        Then::FailRetryable => return Err(OrderError::Busy),
        Then::Panic => panic!("the handler broke after its insert"),
        Then::Enqueue | Then::EnqueueThenFail => {
            call.enqueue("order-placed", &args.order_id)
                .map_err(|e| OrderError::Db(e.to_string()))?;
            if args.then == Then::EnqueueThenFail {
                return Err(OrderError::Busy);
            }
        }
    }
    Ok(Placed {
        order_id: args.order_id,
        reference,
    })
}

/// The far side: the domain tables, read through a connection of their own.
enum Far {
    Postgres(sqlx::PgPool),
    Sqlite(sqlx::SqlitePool),
}

impl Far {
    async fn scalar(&self, sql: &'static str) -> i64 {
        match self {
            Far::Postgres(p) => sqlx::query_scalar(sql).fetch_one(p).await.expect("read"),
            Far::Sqlite(p) => sqlx::query_scalar(sql).fetch_one(p).await.expect("read"),
        }
    }
    async fn orders(&self) -> i64 {
        self.scalar("SELECT count(*) FROM orders").await
    }
    async fn records(&self) -> i64 {
        self.scalar("SELECT count(*) FROM idempotency_records")
            .await
    }
    async fn outbox(&self) -> i64 {
        self.scalar("SELECT count(*) FROM idempotency_outbox").await
    }
    async fn add_customer(&self, id: &str) {
        let q = "INSERT INTO customers (id) VALUES ($1)";
        match self {
            Far::Postgres(p) => sqlx::query(q).bind(id).execute(p).await.map(drop),
            Far::Sqlite(p) => sqlx::query(q).bind(id).execute(p).await.map(drop),
        }
        .expect("add a customer");
    }
}

/// A store of one kind with the `customers` and `orders` tables beside its records.
struct Setup {
    store: Arc<dyn Store>,
    far: Far,
    db: Db,
    _schema: Option<TestSchema>,
    _file: Option<SqliteFile>,
}

async fn postgres(what: &str) -> Option<Setup> {
    let schema = TestSchema::create(what).await?;
    let store = schema.server_clock_store().await;
    let far = schema.pool(4).await;
    sqlx::raw_sql(
        "CREATE TABLE customers (id TEXT PRIMARY KEY); INSERT INTO customers VALUES ('acme');
         CREATE TABLE orders (order_id TEXT PRIMARY KEY, reference TEXT NOT NULL,
             customer TEXT NOT NULL REFERENCES customers (id) DEFERRABLE INITIALLY DEFERRED)",
    )
    .execute(&far)
    .await
    .expect("create the domain tables");
    Some(Setup {
        store: Arc::new(store),
        far: Far::Postgres(far),
        db: Db::Postgres,
        _schema: Some(schema),
        _file: None,
    })
}

async fn sqlite(what: &str) -> Setup {
    let file = SqliteFile::new(what);
    let store = SqliteStore::open(&file.0).await.expect("open sqlite");
    let far = store.pool().clone();
    sqlx::raw_sql(
        "CREATE TABLE customers (id TEXT PRIMARY KEY); INSERT INTO customers VALUES ('acme');
         CREATE TABLE orders (order_id TEXT PRIMARY KEY, reference TEXT NOT NULL,
             customer TEXT NOT NULL REFERENCES customers (id) DEFERRABLE INITIALLY DEFERRED)",
    )
    .execute(&far)
    .await
    .expect("create the domain tables");
    Setup {
        store: Arc::new(store),
        far: Far::Sqlite(far),
        db: Db::Sqlite,
        _schema: None,
        _file: Some(file),
    }
}

/// A context whose engine has started (its secret checked against the store).
async fn ctx(setup: &Setup) -> Ctx {
    Ctx {
        engine: Idempotency::builder_shared(setup.store.clone())
            .start()
            .await
            .expect("start"),
        db: setup.db,
        runs: AtomicUsize::new(0),
        gate: None,
    }
}

fn order(id: &str, then: Then) -> Order {
    Order {
        order_id: id.into(),
        then,
    }
}

/// Every case, on one store.
async fn every_case(setup: Setup) {
    one_commit_and_a_replay(&setup).await;
    a_repeat_during_the_call_is_in_flight_and_sees_nothing(&setup).await;
    a_retryable_error_leaves_nothing(&setup).await;
    a_definitive_error_is_stored_with_the_writes(&setup).await;
    a_panic_rolls_back_and_the_repeat_runs_once(&setup).await;
    a_refused_commit_did_nothing_and_the_repeat_runs_once(&setup).await;
    the_outbox_commits_with_the_call(&setup).await;
}

async fn one_commit_and_a_replay(s: &Setup) {
    let c = ctx(s).await;
    let first = place_order(&c, order("o-1", Then::Answer))
        .await
        .expect("placed");
    let again = place_order(&c, order("o-1", Then::Answer))
        .await
        .expect("replayed");
    assert_eq!(first, again);
    assert_eq!(c.runs.load(Ordering::SeqCst), 1);
    assert_eq!(s.far.orders().await, 1);
    assert_eq!(s.far.records().await, 1);
}

async fn a_repeat_during_the_call_is_in_flight_and_sees_nothing(s: &Setup) {
    let (inside, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let c = Arc::new(Ctx {
        gate: Some((inside.clone(), go.clone())),
        ..ctx(s).await
    });
    let orders_before = s.far.orders().await;
    let first = tokio::spawn({
        let c = c.clone();
        async move { place_order(&c, order("o-2", Then::Answer)).await }
    });
    inside.notified().await;
    // The handler's insert is in; nobody else sees it, and the repeat is told at once.
    assert_eq!(
        s.far.orders().await,
        orders_before,
        "uncommitted writes are invisible"
    );
    // The same engine (its secret already checked: on SQLite every write waits while the
    // call holds the file's write lock).
    let repeat = Ctx {
        engine: c.engine.clone(),
        db: s.db,
        runs: AtomicUsize::new(0),
        gate: None,
    };
    match place_order(&repeat, order("o-2", Then::Answer)).await {
        Err(OrderError::Wrapper(advice)) => assert!(advice.contains("in progress"), "{advice}"),
        other => panic!("expected in flight, got {other:?}"),
    }
    assert_eq!(repeat.runs.load(Ordering::SeqCst), 0);
    go.notify_one();
    let placed = first.await.expect("join").expect("placed");
    assert_eq!(s.far.orders().await, orders_before + 1);
    let later = place_order(&repeat, order("o-2", Then::Answer))
        .await
        .expect("replayed");
    assert_eq!(later, placed);
    assert_eq!(repeat.runs.load(Ordering::SeqCst), 0);
}

async fn a_retryable_error_leaves_nothing(s: &Setup) {
    let c = ctx(s).await;
    let (orders, records) = (s.far.orders().await, s.far.records().await);
    assert!(matches!(
        place_order(&c, order("o-3", Then::FailRetryable)).await,
        Err(OrderError::Busy)
    ));
    assert_eq!(s.far.orders().await, orders, "the insert was rolled back");
    assert_eq!(s.far.records().await, records, "no record was kept");
    place_order(&c, order("o-3", Then::Answer))
        .await
        .expect("runs again");
    assert_eq!(c.runs.load(Ordering::SeqCst), 2);
    assert_eq!(s.far.orders().await, orders + 1);
}

async fn a_definitive_error_is_stored_with_the_writes(s: &Setup) {
    let c = ctx(s).await;
    let orders = s.far.orders().await;
    assert!(matches!(
        place_order(&c, order("o-4", Then::Decline)).await,
        Err(OrderError::Declined)
    ));
    assert!(matches!(
        place_order(&c, order("o-4", Then::Decline)).await,
        Err(OrderError::Declined)
    ));
    assert_eq!(c.runs.load(Ordering::SeqCst), 1, "the refusal is replayed");
    assert_eq!(
        s.far.orders().await,
        orders + 1,
        "its writes committed with it"
    );
}

async fn a_panic_rolls_back_and_the_repeat_runs_once(s: &Setup) {
    let c = ctx(s).await;
    let (orders, records) = (s.far.orders().await, s.far.records().await);
    match place_order(&c, order("o-5", Then::Panic)).await {
        Err(OrderError::Wrapper(advice)) => {
            assert!(advice.contains("rolled back"), "{advice}");
            assert!(advice.contains("Nothing was done"), "{advice}");
        }
        other => panic!("expected a rollback, got {other:?}"),
    }
    assert_eq!(s.far.orders().await, orders);
    assert_eq!(s.far.records().await, records);
    place_order(&c, order("o-5", Then::Answer))
        .await
        .expect("runs once");
    place_order(&c, order("o-5", Then::Answer))
        .await
        .expect("replayed");
    assert_eq!(c.runs.load(Ordering::SeqCst), 2);
    assert_eq!(s.far.orders().await, orders + 1);
}

async fn a_refused_commit_did_nothing_and_the_repeat_runs_once(s: &Setup) {
    let c = ctx(s).await;
    let (orders, records) = (s.far.orders().await, s.far.records().await);
    match place_order(&c, order("o-6", Then::UnknownCustomer)).await {
        Err(OrderError::Wrapper(advice)) => {
            assert!(advice.contains("refused its commit"), "{advice}");
            assert!(advice.contains("Nothing was done"), "{advice}");
        }
        other => panic!("expected a refused commit, got {other:?}"),
    }
    assert_eq!(s.far.orders().await, orders);
    assert_eq!(s.far.records().await, records);
    s.far.add_customer("nobody").await;
    place_order(&c, order("o-6", Then::UnknownCustomer))
        .await
        .expect("runs once");
    place_order(&c, order("o-6", Then::UnknownCustomer))
        .await
        .expect("replayed");
    assert_eq!(c.runs.load(Ordering::SeqCst), 2);
    assert_eq!(s.far.orders().await, orders + 1);
}

async fn the_outbox_commits_with_the_call(s: &Setup) {
    let c = ctx(s).await;
    let outbox = s.far.outbox().await;
    place_order(&c, order("o-7", Then::Enqueue))
        .await
        .expect("placed");
    assert_eq!(s.far.outbox().await, outbox + 1);
    // Enqueued, then rolled back: nothing stays.
    assert!(matches!(
        place_order(&c, order("o-8", Then::EnqueueThenFail)).await,
        Err(OrderError::Busy)
    ));
    assert_eq!(s.far.outbox().await, outbox + 1);
}

#[tokio::test]
#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
async fn on_postgres() {
    let Some(setup) = postgres("transactional").await else {
        return;
    };
    every_case(setup).await;
}

/// PostgreSQL prepares the read of the record once per connection: a connection that lost it
/// (`DEALLOCATE`, a pooler's `DISCARD ALL`) prepares it again, under the server's clock and the
/// engine's.
#[tokio::test]
#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
async fn on_postgres_a_connection_that_lost_the_prepared_read_prepares_it_again() {
    let Some(schema) = TestSchema::create("transactional_prepared").await else {
        return;
    };
    // One connection: the calls and the DEALLOCATE run on the same one.
    let pool = schema.pool(1).await;
    sqlx::raw_sql(
        "CREATE TABLE customers (id TEXT PRIMARY KEY); INSERT INTO customers VALUES ('acme');
         CREATE TABLE orders (order_id TEXT PRIMARY KEY, reference TEXT NOT NULL,
             customer TEXT NOT NULL REFERENCES customers (id) DEFERRABLE INITIALLY DEFERRED)",
    )
    .execute(&pool)
    .await
    .expect("create the domain tables");
    let server = PostgresStore::from_pool(pool.clone()).await.expect("store");
    let engine_clock = server.clone().trusting_engine_clock();
    for (n, store) in [server, engine_clock].into_iter().enumerate() {
        let setup = Setup {
            store: Arc::new(store),
            far: Far::Postgres(pool.clone()),
            db: Db::Postgres,
            _schema: None,
            _file: None,
        };
        let c = ctx(&setup).await;
        let (first, second) = (format!("p-{n}-1"), format!("p-{n}-2"));
        place_order(&c, order(&first, Then::Answer))
            .await
            .expect("placed");
        sqlx::raw_sql("DEALLOCATE idempotency_tx_read")
            .execute(&pool)
            .await
            .expect("the read was prepared on the connection");
        let placed = place_order(&c, order(&second, Then::Answer))
            .await
            .expect("placed after the DEALLOCATE");
        let again = place_order(&c, order(&second, Then::Answer))
            .await
            .expect("replayed");
        assert_eq!(placed, again);
        assert_eq!(c.runs.load(Ordering::SeqCst), 2);
        assert_eq!(setup.far.orders().await, 2 * (n as i64 + 1));
    }
    pool.close().await;
    schema.drop_schema().await;
}

#[tokio::test]
async fn on_a_sqlite_file() {
    every_case(sqlite("transactional").await).await;
}

#[tokio::test]
async fn a_store_that_cannot_run_it_refuses_to_start_naming_the_tool() {
    let refused = Idempotency::builder(MemoryStore::new()).start().await;
    let message = refused.expect_err("refused").to_string();
    assert!(message.contains("place_order"), "{message}");
    assert!(
        message.contains("SqliteStore or PostgresStore"),
        "{message}"
    );
    Idempotency::builder(MemoryStore::new())
        .without_transactional_tools()
        .start()
        .await
        .expect("told it serves none");
}
