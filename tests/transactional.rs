//! `#[idempotent(transactional)]`: the claim, the handler's writes and the outcome in one
//! transaction of the store's database, on PostgreSQL and on a SQLite file. Every count is taken
//! at the far side: the `orders` table the handler writes, read through another connection.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use idempotency::store::{MemoryStore, PostgresStore, SqliteStore, Store};
use idempotency::{idempotent, Call, Caller, Classify, Disposition, Error, Idempotency};
use idempotency_tests::pg::TestSchema;
use idempotency_tests::scripted::{Act, Op, Scripted};
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
    /// Asks for a second borrow of the transaction while holding one.
    BorrowTwice,
    /// Commits the transaction itself.
    CommitItself,
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
    order_body(ctx, args).await
}

/// Inserts the order through the call's transaction, then does what `args.then` says.
async fn order_body(ctx: &Ctx, args: Order) -> Result<Placed, OrderError> {
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
            if args.then == Then::BorrowTwice {
                call.transaction::<sqlx::Postgres>()?;
            }
            if args.then == Then::CommitItself {
                sqlx::query("COMMIT").execute(&mut *tx).await?;
            }
        }
        Db::Sqlite => {
            let mut tx = call.transaction::<sqlx::Sqlite>()?;
            let insert = sqlx::query(INSERT).bind(&args.order_id).bind(&reference);
            insert.bind(customer).execute(&mut *tx).await?;
            if args.then == Then::BorrowTwice {
                call.transaction::<sqlx::Sqlite>()?;
            }
            if args.then == Then::CommitItself {
                sqlx::query("COMMIT").execute(&mut *tx).await?;
            }
        }
    }
    if let Some((inside, go)) = &ctx.gate {
        inside.notify_one();
        go.notified().await;
    }
    match args.then {
        Then::Answer | Then::UnknownCustomer | Then::BorrowTwice | Then::CommitItself => {}
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

/// `place_order` under its own key, for a repeat that waits for the call in progress.
#[idempotent(
    name = "place_order",
    window = "1h",
    business_key = "order_id",
    transactional,
    wait = "30s"
)]
async fn place_order_waiting(ctx: &Ctx, args: Order) -> Result<Placed, OrderError> {
    order_body(ctx, args).await
}

/// `place_order` with a timeout.
#[idempotent(
    name = "place_order",
    window = "1h",
    business_key = "order_id",
    transactional,
    timeout = "300ms"
)]
async fn place_order_timed(ctx: &Ctx, args: Order) -> Result<Placed, OrderError> {
    order_body(ctx, args).await
}

/// Not transactional: it has no transaction to lend.
#[idempotent(window = "1h", on_error = "retryable")]
async fn plain(ctx: &Ctx, args: Order) -> Result<String, OrderError> {
    let call = Call::current().ok_or(OrderError::Busy)?;
    let _ = ctx;
    match call.transaction::<sqlx::Postgres>() {
        Err(e) => Ok(e.to_string()),
        Ok(_) => Ok(format!("{} borrowed a transaction", args.order_id)),
    }
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
    a_second_borrow_is_refused(&setup).await;
    a_handler_that_commits_itself_is_refused(&setup).await;
    a_timeout_rolls_back(&setup).await;
    a_dropped_call_leaves_nothing_and_a_waiting_repeat_runs_it(&setup).await;
    a_waiting_repeat_gets_the_committed_answer(&setup).await;
    past_max_waiters_a_repeat_is_told_in_flight_at_once(&setup).await;
    a_plain_tool_has_no_transaction(&setup).await;
    a_lost_commit_answer_is_unknown_and_the_repeat_replays(&setup).await;
    a_hung_commit_is_abandoned_and_the_repeat_runs_once(&setup).await;
    a_hung_begin_is_not_done(&setup).await;
}

/// A context whose engine's store is `setup`'s behind a [`Scripted`] wrapper.
async fn scripted_ctx(setup: &Setup) -> (Ctx, Arc<Scripted>) {
    let scripted = Scripted::new(setup.store.clone());
    let engine = Idempotency::builder_shared(scripted.clone())
        .start()
        .await
        .expect("start");
    let c = Ctx {
        engine,
        db: setup.db,
        runs: AtomicUsize::new(0),
        gate: None,
    };
    (c, scripted)
}

async fn a_lost_commit_answer_is_unknown_and_the_repeat_replays(s: &Setup) {
    let (c, scripted) = scripted_ctx(s).await;
    scripted.script(Op::Commit, [Act::CommitThenFail]);
    let orders = s.far.orders().await;
    match place_order(&c, order("o-15", Then::Answer)).await {
        Err(OrderError::Wrapper(advice)) => {
            assert!(advice.contains("answer to its commit was lost"), "{advice}");
            assert!(
                advice.contains("if it is not found, nothing was done"),
                "{advice}"
            );
        }
        other => panic!("expected an unknown commit, got {other:?}"),
    }
    assert_eq!(s.far.orders().await, orders + 1, "it did commit");
    let again = place_order(&c, order("o-15", Then::Answer))
        .await
        .expect("replayed");
    assert_eq!(again.order_id, "o-15");
    assert_eq!(c.runs.load(Ordering::SeqCst), 1);
}

async fn a_hung_commit_is_abandoned_and_the_repeat_runs_once(s: &Setup) {
    let (c, scripted) = scripted_ctx(s).await;
    scripted.script(Op::Commit, [Act::Hang]);
    let orders = s.far.orders().await;
    match place_order_timed(&c, order("o-16", Then::Answer)).await {
        Err(OrderError::Wrapper(advice)) => {
            assert!(advice.contains("answer to its commit was lost"), "{advice}")
        }
        other => panic!("expected an unknown commit, got {other:?}"),
    }
    // The abandoned transaction's connection closes; a repeat that waits then runs it once.
    place_order_waiting(&c, order("o-16", Then::Answer))
        .await
        .expect("runs once");
    assert_eq!(c.runs.load(Ordering::SeqCst), 2);
    assert_eq!(s.far.orders().await, orders + 1);
}

async fn a_hung_begin_is_not_done(s: &Setup) {
    let (c, scripted) = scripted_ctx(s).await;
    scripted.script(Op::Begin, [Act::Hang]);
    match place_order_timed(&c, order("o-17", Then::Answer)).await {
        Err(OrderError::Wrapper(advice)) => {
            assert!(advice.contains("was not run"), "{advice}");
            assert!(advice.contains("safe to try again"), "{advice}");
        }
        other => panic!("expected not done, got {other:?}"),
    }
    assert_eq!(c.runs.load(Ordering::SeqCst), 0);
}

async fn a_second_borrow_is_refused(s: &Setup) {
    let c = ctx(s).await;
    let orders = s.far.orders().await;
    match place_order(&c, order("o-9", Then::BorrowTwice)).await {
        Err(OrderError::Db(e)) => assert!(e.contains("already borrowed"), "{e}"),
        other => panic!("expected the second borrow refused, got {other:?}"),
    }
    assert_eq!(s.far.orders().await, orders);
}

async fn a_handler_that_commits_itself_is_refused(s: &Setup) {
    let c = ctx(s).await;
    let records = s.far.records().await;
    match place_order(&c, order("o-10", Then::CommitItself)).await {
        Err(OrderError::Wrapper(advice)) => {
            assert!(
                advice.contains("ended the call's transaction itself")
                    || advice.contains("ended the transaction itself"),
                "{advice}"
            )
        }
        other => panic!("expected the call refused, got {other:?}"),
    }
    assert_eq!(
        s.far.records().await,
        records,
        "no record for a call whose transaction was not its own"
    );
}

async fn a_timeout_rolls_back(s: &Setup) {
    let (inside, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let c = Ctx {
        gate: Some((inside, go)),
        ..ctx(s).await
    };
    let (orders, records) = (s.far.orders().await, s.far.records().await);
    // The gate is never opened: the body is still waiting when the timeout passes.
    match place_order_timed(&c, order("o-11", Then::Answer)).await {
        Err(OrderError::Wrapper(advice)) => {
            assert!(advice.contains("ran past its timeout"), "{advice}");
            assert!(advice.contains("Nothing was done"), "{advice}");
        }
        other => panic!("expected a rollback, got {other:?}"),
    }
    assert_eq!(s.far.orders().await, orders);
    assert_eq!(s.far.records().await, records);
}

async fn a_dropped_call_leaves_nothing_and_a_waiting_repeat_runs_it(s: &Setup) {
    let (inside, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let c = Arc::new(Ctx {
        gate: Some((inside.clone(), go)),
        ..ctx(s).await
    });
    let orders = s.far.orders().await;
    let first = tokio::spawn({
        let c = c.clone();
        async move { place_order(&c, order("o-12", Then::Answer)).await }
    });
    inside.notified().await;
    first.abort();
    assert!(first.await.is_err_and(|e| e.is_cancelled()));
    // The repeat waits while the dropped call's connection closes, then runs it once.
    let repeat = Ctx {
        engine: c.engine.clone(),
        db: s.db,
        runs: AtomicUsize::new(0),
        gate: None,
    };
    place_order_waiting(&repeat, order("o-12", Then::Answer))
        .await
        .expect("runs as a fresh call");
    assert_eq!(repeat.runs.load(Ordering::SeqCst), 1);
    assert_eq!(s.far.orders().await, orders + 1);
}

async fn a_waiting_repeat_gets_the_committed_answer(s: &Setup) {
    let (inside, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let c = Arc::new(Ctx {
        gate: Some((inside.clone(), go.clone())),
        ..ctx(s).await
    });
    let first = tokio::spawn({
        let c = c.clone();
        async move { place_order(&c, order("o-13", Then::Answer)).await }
    });
    inside.notified().await;
    let repeat = Arc::new(Ctx {
        engine: c.engine.clone(),
        db: s.db,
        runs: AtomicUsize::new(0),
        gate: None,
    });
    let waiting = tokio::spawn({
        let repeat = repeat.clone();
        async move { place_order_waiting(&repeat, order("o-13", Then::Answer)).await }
    });
    go.notify_one();
    let placed = first.await.expect("join").expect("placed");
    let waited = waiting.await.expect("join").expect("the committed answer");
    assert_eq!(placed, waited);
    assert_eq!(
        repeat.runs.load(Ordering::SeqCst),
        0,
        "the waiting repeat did not run it"
    );
}

async fn past_max_waiters_a_repeat_is_told_in_flight_at_once(s: &Setup) {
    let (inside, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let engine = Idempotency::builder_shared(s.store.clone())
        .max_waiters(1)
        .start()
        .await
        .expect("start");
    let ctx_with = |gate| {
        Arc::new(Ctx {
            engine: engine.clone(),
            db: s.db,
            runs: AtomicUsize::new(0),
            gate,
        })
    };
    let c = ctx_with(Some((inside.clone(), go.clone())));
    let first = tokio::spawn({
        let c = c.clone();
        async move { place_order(&c, order("o-18", Then::Answer)).await }
    });
    inside.notified().await;
    let repeat = ctx_with(None);
    let waiting = |repeat: Arc<Ctx>| {
        tokio::spawn(async move { place_order_waiting(&repeat, order("o-18", Then::Answer)).await })
    };
    let (mut a, mut b) = (waiting(repeat.clone()), waiting(repeat.clone()));
    // While the first call is held, only one repeat may wait: the other is answered at once.
    let (told, other) = tokio::select! {
        told = &mut a => (told, b),
        told = &mut b => (told, a),
    };
    match told.expect("join") {
        Err(OrderError::Wrapper(advice)) => assert!(advice.contains("in progress"), "{advice}"),
        got => panic!("expected in flight at once, got {got:?}"),
    }
    go.notify_one();
    let placed = first.await.expect("join").expect("placed");
    assert_eq!(
        other.await.expect("join").expect("the waiter's answer"),
        placed
    );
    assert_eq!(repeat.runs.load(Ordering::SeqCst), 0);
}

async fn a_plain_tool_has_no_transaction(s: &Setup) {
    let c = ctx(s).await;
    let said = plain(&c, order("o-14", Then::Answer))
        .await
        .expect("answered");
    assert!(said.contains("is not a transactional tool"), "{said}");
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
        // A statement of that name that is not the store's (as behind a pooler that moved the
        // session): the call reads with literals instead.
        let third = format!("p-{n}-3");
        sqlx::raw_sql(
            "DEALLOCATE idempotency_tx_read; PREPARE idempotency_tx_read (TEXT) AS SELECT $1",
        )
        .execute(&pool)
        .await
        .expect("a foreign statement under the read's name");
        place_order(&c, order(&third, Then::Answer))
            .await
            .expect("placed with a literal read");
        place_order(&c, order(&third, Then::Answer))
            .await
            .expect("replayed with a literal read");
        sqlx::raw_sql("DEALLOCATE idempotency_tx_read")
            .execute(&pool)
            .await
            .expect("the foreign statement is still there");
        let again = place_order(&c, order(&second, Then::Answer))
            .await
            .expect("replayed");
        assert_eq!(placed, again);
        assert_eq!(c.runs.load(Ordering::SeqCst), 3);
        assert_eq!(setup.far.orders().await, 3 * (n as i64 + 1));
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
    // Redis too: records there are not in the handler's database.
    let redis = idempotency_tests::backends::Backend::redis("transactional", false).await;
    let refused = Idempotency::builder_shared(redis.store.clone())
        .start()
        .await;
    let message = refused.expect_err("refused").to_string();
    assert!(message.contains("place_order"), "{message}");
    redis.finish().await;
}

/// Through an MCP client: an rmcp tool that is `transactional`, and the status tool while its
/// call runs (its record appears only at the commit).
mod over_mcp {
    use std::sync::Arc;

    use idempotency::mcp::{status_router, Identity, META_REPLAYED};
    use idempotency::{idempotent, idempotent_tools, Call, Caller, Error, Idempotency};
    use rmcp::handler::server::router::tool::ToolRouter;
    use rmcp::handler::server::wrapper::{Json, Parameters};
    use rmcp::model::{CallToolRequestParams, CallToolResult, ServerCapabilities, ServerConfig};
    use rmcp::service::{RequestContext, RunningService};
    use rmcp::{schemars, tool, tool_handler, tool_router, RoleClient, RoleServer, ServiceExt};
    use serde::{Deserialize, Serialize};
    use serde_json::{json, Value};
    use tokio::sync::Notify;

    use super::{postgres, sqlite, Far, Setup};

    #[derive(Serialize, Deserialize, schemars::JsonSchema)]
    struct OrderArgs {
        order_id: String,
    }

    #[derive(Serialize, Deserialize, schemars::JsonSchema)]
    struct Placed {
        order_id: String,
        reference: String,
    }

    #[derive(Clone)]
    struct Shop {
        engine: Idempotency,
        sqlite: bool,
        inside: Arc<Notify>,
        go: Arc<Notify>,
        tool_router: ToolRouter<Self>,
    }

    impl idempotency::IdempotencyContext<RequestContext<RoleServer>> for Shop {
        fn idempotency(&self) -> &Idempotency {
            &self.engine
        }
        fn caller(&self, request: &RequestContext<RoleServer>) -> Result<Caller, Error> {
            Identity::stdio(Caller::new("acme", "alice")).resolve(request)
        }
    }

    #[idempotent_tools]
    #[tool_router]
    impl Shop {
        #[idempotent(
            window = "1h",
            business_key = "order_id",
            transactional,
            on_error = "retryable"
        )]
        #[tool(description = "Place an order: one row in the orders table.")]
        async fn place_order(
            &self,
            Parameters(args): Parameters<OrderArgs>,
        ) -> Result<Json<Placed>, String> {
            let call = Call::current().ok_or("not wrapped")?;
            let reference = call.reference().to_string();
            let insert =
                "INSERT INTO orders (order_id, reference, customer) VALUES ($1, $2, 'acme')";
            if self.sqlite {
                let mut tx = call
                    .transaction::<sqlx::Sqlite>()
                    .map_err(|e| e.to_string())?;
                sqlx::query(insert)
                    .bind(&args.order_id)
                    .bind(&reference)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| e.to_string())?;
            } else {
                let mut tx = call
                    .transaction::<sqlx::Postgres>()
                    .map_err(|e| e.to_string())?;
                sqlx::query(insert)
                    .bind(&args.order_id)
                    .bind(&reference)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            self.inside.notify_one();
            self.go.notified().await;
            Ok(Json(Placed {
                order_id: args.order_id,
                reference,
            }))
        }
    }

    #[tool_handler(router = self.tool_router)]
    impl rmcp::ServerHandler for Shop {
        fn get_info(&self) -> ServerConfig {
            ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
        }
    }

    type Client = RunningService<RoleClient, ()>;

    async fn call(client: &Client, tool: &str, args: Value) -> CallToolResult {
        let args = args.as_object().cloned().unwrap_or_default();
        client
            .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(args))
            .await
            .expect("call_tool")
    }

    fn structured(r: &CallToolResult) -> Value {
        r.structured_content.clone().unwrap_or(Value::Null)
    }

    async fn status_while_running(setup: Setup) {
        let (inside, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let shop = Shop {
            engine: Idempotency::builder_shared(setup.store.clone())
                .start()
                .await
                .expect("start"),
            sqlite: matches!(setup.far, Far::Sqlite(_)),
            inside: inside.clone(),
            go: go.clone(),
            tool_router: Shop::tool_router() + status_router::<Shop>(),
        };
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            if let Ok(s) = shop.serve(server_io).await {
                let _ = s.waiting().await;
            }
        });
        let client = Arc::new(().serve(client_io).await.expect("client"));
        let tools = client.list_all_tools().await.expect("tools/list");
        let hint = tools
            .iter()
            .find(|t| t.name == "place_order")
            .and_then(|t| t.annotations.as_ref())
            .and_then(|a| a.idempotent_hint);
        assert_eq!(hint, Some(true));

        let first = tokio::spawn({
            let client = client.clone();
            async move { call(&client, "place_order", json!({"order_id": "m-1"})).await }
        });
        inside.notified().await;
        let repeat = call(&client, "place_order", json!({"order_id": "m-1"})).await;
        assert_eq!(repeat.is_error, Some(true));
        let reference = repeat
            .meta
            .as_ref()
            .and_then(|m| m.0.get(idempotency::mcp::META_REF))
            .and_then(Value::as_str)
            .expect("the in-flight answer names its ref")
            .to_owned();
        let status = call(
            &client,
            idempotency::error::STATUS_TOOL,
            json!({"ref": reference}),
        )
        .await;
        assert_eq!(structured(&status)["state"], "in_flight", "{status:?}");
        go.notify_one();
        let first = first.await.expect("join");
        assert_eq!(first.is_error, Some(false), "{first:?}");
        let status = call(
            &client,
            idempotency::error::STATUS_TOOL,
            json!({"ref": reference}),
        )
        .await;
        assert_eq!(structured(&status)["state"], "completed", "{status:?}");
        assert_eq!(structured(&status)["answer"], structured(&first));
        // The replay does not run the body (which would wait on the gate).
        let later = call(&client, "place_order", json!({"order_id": "m-1"})).await;
        assert_eq!(
            later.meta.as_ref().and_then(|m| m.0.get(META_REPLAYED)),
            Some(&Value::Bool(true))
        );
        assert_eq!(setup.far.orders().await, 1);
    }

    #[tokio::test]
    #[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
    async fn on_postgres() {
        let Some(setup) = postgres("transactional_mcp").await else {
            return;
        };
        status_while_running(setup).await;
    }

    #[tokio::test]
    async fn on_a_sqlite_file() {
        status_while_running(sqlite("transactional_mcp").await).await;
    }
}

/// A repeat that waits for a transactional call in progress waits as any repeat does: counted
/// in `idempotency_waited_total`, and answered with the committed answer without running it.
/// The call's transaction is metered as store calls are (`begin`, `commit`, and the waiting
/// repeat's `running`).
#[test]
fn a_waiting_repeat_of_a_transactional_call_is_counted() {
    use metrics_util::debugging::DebugValue;
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // The repeats counted as waiting, and the store operations timed with how many times each
    // (a snapshot drains the histograms: their counts are kept here).
    let timed = std::cell::RefCell::new(std::collections::BTreeMap::<String, usize>::new());
    let waited = || -> u64 {
        let mut waited = 0;
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let key = key.key();
            match value {
                DebugValue::Counter(n) if key.name() == "idempotency_waited_total" => waited += n,
                DebugValue::Histogram(v) if key.name() == "idempotency_store_seconds" => {
                    if let Some(op) = key.labels().find(|l| l.key() == "operation") {
                        *timed.borrow_mut().entry(op.value().to_owned()).or_default() += v.len();
                    }
                }
                _ => {}
            }
        }
        waited
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let s = sqlite("tx_waited_counted").await;
            let (inside, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
            let c = Arc::new(Ctx {
                gate: Some((inside.clone(), go.clone())),
                ..ctx(&s).await
            });
            let mut first = tokio::spawn({
                let c = c.clone();
                async move { place_order(&c, order("o-30", Then::Answer)).await }
            });
            inside.notified().await;
            let repeat = Arc::new(Ctx {
                engine: c.engine.clone(),
                db: s.db,
                runs: AtomicUsize::new(0),
                gate: None,
            });
            let waiting = tokio::spawn({
                let repeat = repeat.clone();
                async move { place_order_waiting(&repeat, order("o-30", Then::Answer)).await }
            });
            // The first call is held until the repeat has begun to wait (the counter says so);
            // a repeat that is never counted fails here, not by hanging.
            let counted = async {
                while waited() == 0 {
                    assert!(
                        !waiting.is_finished(),
                        "the repeat answered without waiting"
                    );
                    tokio::select! {
                        biased;
                        ended = &mut first => panic!("the first call ended while held: {ended:?}"),
                        () = tokio::task::yield_now() => {}
                    }
                }
            };
            tokio::time::timeout(std::time::Duration::from_secs(30), counted)
                .await
                .expect("the waiting repeat is counted");
            go.notify_one();
            let placed = first.await.expect("join").expect("placed");
            let answered = waiting.await.expect("join").expect("the committed answer");
            assert_eq!(placed, answered);
            assert_eq!(
                repeat.runs.load(Ordering::SeqCst),
                0,
                "the repeat did not run it"
            );
            assert_eq!(s.far.orders().await, 1);
        })
    });
    // The last histogram values (a snapshot takes them), then the operations timed.
    waited();
    let timed = timed.into_inner();
    for op in ["begin", "commit", "running"] {
        assert!(timed.get(op).is_some_and(|n| *n >= 1), "{op}: {timed:?}");
    }
}
