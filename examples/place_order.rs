//! The place_order MCP server: `place_order` writes a row of the `orders` table in the store's own
//! database, wrapped with `#[idempotent(window = "1h", business_key = "order_id", transactional,
//! timeout = "10s")]`: the claim, the order and the call's answer are one commit, bounded by the
//! timeout (the database ends a transaction still open a second after it). A worker that dies leaves nothing
//! (the database rolls the transaction back) and the next repeat places the order once; a repeat
//! after the commit is replayed. Also `idempotency_status`.
//!
//! No arguments: stdio (what MCP hosts launch). `--http ADDR`: streamable HTTP at
//! `http://ADDR/mcp`, callers identified by bearer token. Store and `orders` table: the SQLite
//! file `idempotency.db` by default, PostgreSQL when `DATABASE_URL` is set; the table is created
//! at start-up if missing.
//!
//! A binary of its own, not in the examples library: an engine refuses to start on a store that
//! cannot run a transactional tool linked into its program (memory, Redis), and the library is
//! linked into programs that run such engines.

use idempotency::mcp::{status_router, Identity};
use idempotency::{
    idempotent, idempotent_tools, Call, Caller, Classify, Disposition, Error, Idempotency,
    IdempotencyContext, TransactionError,
};
use idempotency_examples::charge::CURRENCIES;
use idempotency_examples::{Database, Transport};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{Implementation, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::{schemars, tool, tool_handler, tool_router, RoleServer, ServerHandler};
use serde::{Deserialize, Serialize};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The `orders` table, beside the store's records: an order id is the caller's tenant's own (as
/// the call's key is), so two tenants' `cart-1` are two orders.
const CREATE_ORDERS: &str = "CREATE TABLE IF NOT EXISTS orders (
    tenant TEXT NOT NULL,
    order_id TEXT NOT NULL,
    reference TEXT NOT NULL,
    items TEXT NOT NULL,
    amount_cents BIGINT NOT NULL,
    currency TEXT NOT NULL,
    PRIMARY KEY (tenant, order_id)
)";

/// An order of its own (`ON CONFLICT`): an `order_id` another call of the tenant placed is not
/// overwritten.
const INSERT_ORDER: &str =
    "INSERT INTO orders (tenant, order_id, reference, items, amount_cents, currency)
    VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (tenant, order_id) DO NOTHING";

/// The arguments of `place_order`.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
struct OrderArgs {
    /// The order's id, chosen by the caller (the shop's cart id): the call's key.
    order_id: String,
    /// What is ordered (at least one line).
    items: Vec<Line>,
    /// ISO 4217 currency code.
    currency: String,
}

/// One line of an order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
struct Line {
    /// The product.
    sku: String,
    /// How many (at least 1).
    quantity: u32,
    /// The price of one, in minor units (cents).
    unit_cents: u64,
}

impl OrderArgs {
    /// Checks the arguments before anything is written; the order's total in minor units.
    fn validate(&self) -> Result<i64, OrderError> {
        let invalid = |why: String| Err(OrderError::Invalid(why));
        if self.order_id.trim().is_empty() || self.order_id.len() > 64 {
            return invalid("the order id must be 1 to 64 characters".into());
        }
        if !CURRENCIES.contains(&self.currency.as_str()) {
            return invalid(format!(
                "unknown currency {:?} (one of {})",
                self.currency,
                CURRENCIES.join(", ")
            ));
        }
        if self.items.is_empty() {
            return invalid("the order has no items".into());
        }
        let mut total: i64 = 0;
        for (i, line) in self.items.iter().enumerate() {
            if line.sku.trim().is_empty() {
                return invalid(format!("item {i} has no sku"));
            }
            if line.quantity == 0 || line.unit_cents == 0 {
                return invalid(format!(
                    "item {i} ({}) needs a positive quantity and price",
                    line.sku
                ));
            }
            let amount = i64::try_from(line.unit_cents)
                .ok()
                .and_then(|unit| unit.checked_mul(i64::from(line.quantity)))
                .and_then(|amount| total.checked_add(amount));
            match amount {
                Some(sum) => total = sum,
                None => return invalid("the order's total is too large".into()),
            }
        }
        Ok(total)
    }
}

/// A placed order: `place_order`'s answer.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
struct Order {
    /// The order's id.
    order_id: String,
    /// What was ordered.
    items: Vec<Line>,
    /// The total, in minor units.
    amount_cents: i64,
    /// ISO 4217 currency code.
    currency: String,
    /// The reference of the call that placed it (the status tool's `ref`).
    reference: String,
}

/// Why an order was not placed, and what that means for a repeat.
#[derive(Debug, thiserror::Error, Serialize, Deserialize)]
enum OrderError {
    /// The arguments are wrong; nothing was written. Correct them and call again.
    #[error("invalid order, nothing was placed: {0}. Correct it and call again.")]
    Invalid(String),
    /// Another call (another caller, or after this call's window) placed this order id: final.
    #[error("order {0} already exists: it was placed by another call; nothing was placed")]
    Exists(String),
    /// The database failed; the transaction is rolled back: safe to run again.
    #[error("the order could not be written, nothing was placed: {0}")]
    Database(String),
}

impl Classify for OrderError {
    fn disposition(&self) -> Disposition {
        match self {
            // Nothing happened: rolled back, no record, so it never stands in for a later call.
            OrderError::Invalid(_) | OrderError::Database(_) => Disposition::Retryable,
            OrderError::Exists(_) => Disposition::Definitive,
        }
    }
}

impl From<sqlx::Error> for OrderError {
    fn from(e: sqlx::Error) -> Self {
        OrderError::Database(e.to_string())
    }
}

impl From<TransactionError> for OrderError {
    fn from(e: TransactionError) -> Self {
        OrderError::Database(e.to_string())
    }
}

/// The orders MCP server.
#[derive(Clone)]
struct Orders {
    engine: Idempotency,
    identity: Identity,
    /// The store's database: which transaction `place_order` borrows.
    database: Database,
    tool_router: ToolRouter<Self>,
}

impl IdempotencyContext<RequestContext<RoleServer>> for Orders {
    fn idempotency(&self) -> &Idempotency {
        &self.engine
    }
    fn caller(&self, request: &RequestContext<RoleServer>) -> Result<Caller, Error> {
        self.identity.resolve(request)
    }
}

#[idempotent_tools]
#[tool_router]
impl Orders {
    /// Place an order. Safe to repeat: the order and the call's answer commit together.
    #[idempotent(
        window = "1h",
        business_key = "order_id",
        transactional,
        timeout = "10s"
    )]
    #[tool(
        description = "Place an order. Repeating the call for the same order_id within an hour returns the first order instead of placing another."
    )]
    async fn place_order(
        &self,
        Parameters(args): Parameters<OrderArgs>,
        request: RequestContext<RoleServer>,
    ) -> Result<Json<Order>, OrderError> {
        // First, before any write: a refusal here is rolled back and not stored (see Classify).
        let amount_cents = args.validate()?;
        // The call's key is the tenant's: so is the order id.
        let tenant = self
            .identity
            .resolve(&request)
            .map_err(|e| OrderError::Database(e.to_string()))?
            .tenant;
        let call = Call::current()
            .ok_or_else(|| OrderError::Database("not inside an idempotent call".into()))?;
        let reference = call.reference().to_string();
        let items =
            serde_json::to_string(&args.items).map_err(|e| OrderError::Database(e.to_string()))?;
        // The call's own transaction, on the store's database: the order commits with the answer.
        // (The handler picks the database its store runs on.)
        let placed = match &self.database {
            Database::Postgres(_) => {
                let mut tx = call.transaction::<sqlx::Postgres>()?;
                sqlx::query(INSERT_ORDER)
                    .bind(&tenant)
                    .bind(&args.order_id)
                    .bind(&reference)
                    .bind(&items)
                    .bind(amount_cents)
                    .bind(&args.currency)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected()
            }
            Database::Sqlite(_) => {
                let mut tx = call.transaction::<sqlx::Sqlite>()?;
                sqlx::query(INSERT_ORDER)
                    .bind(&tenant)
                    .bind(&args.order_id)
                    .bind(&reference)
                    .bind(&items)
                    .bind(amount_cents)
                    .bind(&args.currency)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected()
            }
        };
        if placed == 0 {
            return Err(OrderError::Exists(args.order_id));
        }
        Ok(Json(Order {
            order_id: args.order_id,
            items: args.items,
            amount_cents,
            currency: args.currency,
            reference,
        }))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Orders {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build()).with_server_info(
            Implementation::new("idempotency-place-order", env!("CARGO_PKG_VERSION"))
                .with_title("Orders (idempotency example)"),
        )
    }
}

/// Creates the `orders` table if it is missing (on PostgreSQL under a lock: replicas may start
/// together).
async fn create_orders(database: &Database) -> Result<(), sqlx::Error> {
    match database {
        Database::Postgres(pool) => {
            let mut tx = pool.begin().await?;
            sqlx::query("SELECT pg_advisory_xact_lock(hashtext('idempotency-examples orders'))")
                .execute(&mut *tx)
                .await?;
            sqlx::query(CREATE_ORDERS).execute(&mut *tx).await?;
            tx.commit().await
        }
        Database::Sqlite(pool) => sqlx::query(CREATE_ORDERS).execute(pool).await.map(drop),
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    idempotency_examples::exit(run().await)
}

async fn run() -> Result<(), BoxError> {
    idempotency_examples::init_logging();
    let transport = Transport::from_args()?;
    let (engine, database, store) = idempotency_examples::engine_and_database_from_env().await?;
    create_orders(&database)
        .await
        .map_err(|e| format!("cannot create the orders table on the {store}: {e}"))?;
    tracing::info!("place_order server on {store}");
    let identity = Identity::stdio(idempotency_examples::stdio_caller());
    idempotency_examples::serve(
        move || Orders {
            engine: engine.clone(),
            identity: identity.clone(),
            database: database.clone(),
            tool_router: Orders::tool_router() + status_router::<Orders>(),
        },
        transport,
    )
    .await
}
